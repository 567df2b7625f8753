import Foundation
import Logging
import PostgresNIO

extension LedgerRetention {
    /// An export of a month as `ledger_exports` recorded it.
    struct Export: Sendable, Equatable {
        var format: LedgerExportFormat
        var rows: Int64
        var bytes: Int64
        var sha256: String
        var path: String

        /// `jsonl: 12 rows, sha256 …`, as a refusal names it.
        var summary: String { "\(format.rawValue): \(rows) rows, sha256 \(sha256)" }
    }

    /// What is known of a month before anything is locked: the cheap refusals come from here, so
    /// that a month that cannot go (not exported, dropped already) costs the hourly job no lock
    /// and no read of its rows.
    struct State: Sendable {
        var droppedAt: Date?
        /// Whether the month's partition is attached to the ledger.
        var held: Bool
        /// Rows of the month in `usage_ledger_default` (only possible while it has no partition:
        /// PostgreSQL routes a row to its month's partition and refuses to attach one while the
        /// default partition holds rows of it).
        var defaultRows: Int64
        var exports: [Export]
    }

    func read(_ month: LedgerMonth, partition: String) async throws -> State {
        let logger = self.logger
        return try await database.run { client in
            let dropped = try await client.query(
                "SELECT dropped_at FROM ledger_dropped_months WHERE month = \(month.firstDay)::date", logger: logger
            ).decode(Date.self).collect().first
            let held =
                try await client.query(
                    """
                    SELECT count(*)::bigint FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                     WHERE i.inhparent = 'usage_ledger'::regclass AND c.relname = \(partition)
                    """, logger: logger
                ).decode(Int64.self).collect().first == 1
            var defaultRows: Int64 = 0
            if !held {
                defaultRows =
                    try await client.query(
                        """
                        SELECT count(*)::bigint FROM usage_ledger
                         WHERE created_at >= \(month.start) AND created_at < \(month.end)
                        """, logger: logger
                    ).decode(Int64.self).collect().first ?? 0
            }
            let exports = try await client.query(
                """
                SELECT format, rows, bytes, sha256, path FROM ledger_exports
                 WHERE month = \(month.firstDay)::date ORDER BY format
                """, logger: logger
            ).decode((String, Int64, Int64, String, String).self).collect()
            return State(
                droppedAt: dropped, held: held, defaultRows: defaultRows,
                exports: exports.compactMap { row in
                    LedgerExportFormat(rawValue: row.0).map { Export(format: $0, rows: row.1, bytes: row.2, sha256: row.3, path: row.4) }
                })
        }
    }

    /// The drop, on one connection, in two transactions, so that the month's rows are read whole
    /// without a lock and the lock that stops writes into the month is held only for a short
    /// server-side check:
    /// 1. a session advisory lock (another drop running: refused as busy, not queued on table locks);
    /// 2. the check, in one `REPEATABLE READ READ ONLY` snapshot, no lock but the reads': no
    ///    unsettled charge (`capgate unsettled`'s notion: charged, `settled_at` NULL); the month's
    ///    rows encoded as each recorded export's format and hashed as the export writes them
    ///    (``LedgerExport/query(_:)``, ``LedgerRowEncoder``), one export matching in rows, bytes and
    ///    SHA-256; and the month's fingerprint (``fingerprint(_:on:logger:)``);
    /// 3. the drop's transaction, `lock_timeout` 1 s: the month's partition locked `SHARE` (no
    ///    write into it until the commit; reads go on), its fingerprint again, equal (else refused:
    ///    rows changed during the check), so the rows dropped are the rows checked; the totals for
    ///    `capgate verify` and the month's record; `DETACH PARTITION` (`ACCESS EXCLUSIVE` on the
    ///    ledger until the commit: milliseconds) and `DROP TABLE`.
    /// `DETACH … CONCURRENTLY` is not used: PostgreSQL refuses it inside a transaction block (so
    /// the detach, the drop and the totals could not commit together) and refuses it outright on
    /// a table with a default partition, as `usage_ledger` has.
    static func drop(
        _ month: LedgerMonth, partition: String, exports: [Export], on connection: PostgresConnection, logger: Logger
    ) async throws -> Dropped {
        let locked =
            try await connection.query("SELECT pg_try_advisory_lock(\(lockKey))", logger: logger)
            .decode(Bool.self).collect().first ?? false
        guard locked else { throw Refusal.busy(month, "another drop of a ledger month is running") }
        do {
            let checked = try await inTransaction(connection, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger) {
                try await check(month, partition: partition, exports: exports, on: connection, logger: logger)
            }
            let dropped = try await inTransaction(connection, "BEGIN", logger: logger) {
                try await dropChecked(month, partition: partition, checked: checked, on: connection, logger: logger)
            }
            _ = try await connection.query("SELECT pg_advisory_unlock(\(lockKey))", logger: logger).collect()
            return dropped
        } catch {
            _ = try? await connection.query("SELECT pg_advisory_unlock(\(lockKey))", logger: logger).collect()
            throw error
        }
    }

    /// `body` between `begin` and `COMMIT`; `ROLLBACK` when it throws.
    static func inTransaction<T: Sendable>(
        _ connection: PostgresConnection, _ begin: String, logger: Logger, _ body: () async throws -> T
    ) async throws -> T {
        _ = try await connection.query(PostgresQuery(unsafeSQL: begin), logger: logger).collect()
        do {
            let result = try await body()
            _ = try await connection.query("COMMIT", logger: logger).collect()
            return result
        } catch {
            _ = try? await connection.query("ROLLBACK", logger: logger).collect()
            throw error
        }
    }

    /// What the check found: the export that matches, and the fingerprint of the rows it read.
    struct Checked: Sendable {
        var export: Export
        var fingerprint: String
    }

    /// Step 2 of ``drop(_:partition:exports:on:logger:)``, in the snapshot the caller began.
    static func check(
        _ month: LedgerMonth, partition: String, exports: [Export], on connection: PostgresConnection, logger: Logger
    ) async throws -> Checked {
        _ = try await connection.query("SELECT set_config('statement_timeout', '0', true)", logger: logger).collect()
        let unsettled =
            try await connection.query(
                "SELECT count(*)::bigint FROM \(unescaped: partition) WHERE outcome = 'charged' AND settled_at IS NULL", logger: logger
            ).decode(Int64.self).collect().first ?? 0
        guard unsettled == 0 else { throw Refusal.unsettled(month, charges: unsettled) }

        let now = try await digests(month, formats: exports.map(\.format), on: connection, logger: logger)
        let matching = exports.first { export in
            now[export.format].map { $0.rows == export.rows && $0.bytes == export.bytes && $0.sha256 == export.sha256 } ?? false
        }
        guard let export = matching else {
            let current = exports.map { export in
                let digest = now[export.format]!
                return "\(export.format.rawValue): \(digest.rows) rows, sha256 \(digest.sha256)"
            }
            throw Refusal.exportStale(month, exported: exports.map(\.summary), now: current)
        }
        return Checked(export: export, fingerprint: try await fingerprint(partition, on: connection, logger: logger))
    }

    /// Step 3: the month locked, unchanged since the check, then its totals kept and its
    /// partition detached and dropped.
    static func dropChecked(
        _ month: LedgerMonth, partition: String, checked: Checked, on connection: PostgresConnection, logger: Logger
    ) async throws -> Dropped {
        _ = try await connection.query("SELECT set_config('lock_timeout', \(lockTimeout), true)", logger: logger).collect()
        _ = try await connection.query("SELECT set_config('statement_timeout', '0', true)", logger: logger).collect()
        try await lockOrRefuse(month, "LOCK TABLE \(partition) IN SHARE MODE", on: connection, logger: logger)
        guard try await fingerprint(partition, on: connection, logger: logger) == checked.fingerprint else {
            throw Refusal.busy(month, "rows of it were written while it was checked")
        }
        let export = checked.export
        try await keepTotals(month, export: export, on: connection, logger: logger)
        try await lockOrRefuse(month, "ALTER TABLE usage_ledger DETACH PARTITION \(partition)", on: connection, logger: logger)
        _ = try await connection.query("DROP TABLE \(unescaped: partition)", logger: logger).collect()
        return Dropped(month: month, rows: export.rows, format: export.format.rawValue, sha256: export.sha256, path: export.path)
    }

    /// Which row versions the partition holds: their count and a sum of a hash of each one's
    /// place and creating transaction (`ctid`, `xmin`). A row version never changes once written
    /// (an update or a settlement writes a new one, with the writer's `xmin`), so the same
    /// fingerprint means the same rows; it is computed in the server, far faster than the
    /// export's encoding, which is what keeps the lock short. (A `VACUUM FULL` in between moves
    /// rows and refuses the drop once; the next round passes.)
    static func fingerprint(_ partition: String, on connection: PostgresConnection, logger: Logger) async throws -> String {
        try await connection.query(
            """
            SELECT count(*)::text || ':' || coalesce(sum(hashtextextended(ctid::text || '/' || xmin::text, 0)), 0)::text
              FROM \(unescaped: partition)
            """, logger: logger
        ).decode(String.self).collect().first ?? ""
    }

    /// Runs a statement that takes a table lock; a lock not had within ``lockTimeout`` is a
    /// refusal (busy), not an error: the next round tries again.
    static func lockOrRefuse(_ month: LedgerMonth, _ sql: String, on connection: PostgresConnection, logger: Logger) async throws {
        do {
            _ = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger).collect()
        } catch let error as PSQLError where ["55P03", "40P01"].contains(error.serverInfo?[.sqlState] ?? "") {
            // lock_not_available, or deadlock_detected (a write into the month that waited for
            // the check's lock holds the ledger's, which the detach needs): this drop gives way.
            throw Refusal.busy(month, "a lock on the ledger was not had within \(lockTimeout) (statements in progress)")
        }
    }

    /// The month's rows hashed as each format's export would write them: rows, bytes, SHA-256.
    static func digests(
        _ month: LedgerMonth, formats: [LedgerExportFormat], on connection: PostgresConnection, logger: Logger
    ) async throws -> [LedgerExportFormat: (rows: Int64, bytes: Int64, sha256: String)] {
        let encoders = formats.map { LedgerRowEncoder(format: $0, columns: LedgerExport.columns) }
        var sinks = formats.map { _ in ExportDigest() }
        for index in encoders.indices { encoders[index].header(into: &sinks[index].buffer) }
        var count: Int64 = 0
        for try await row in try await connection.query(LedgerExport.query(month), logger: logger) {
            for index in encoders.indices {
                encoders[index].row(row, into: &sinks[index].buffer)
                sinks[index].flushIfFull()
            }
            count += 1
        }
        var out: [LedgerExportFormat: (rows: Int64, bytes: Int64, sha256: String)] = [:]
        for index in formats.indices {
            let (bytes, sha256) = sinks[index].finish()
            out[formats[index]] = (count, bytes, sha256)
        }
        return out
    }

    /// What `capgate verify` sums of the month's charged rows (the view `usage_ledger_charged`),
    /// grouped by every key it groups by, and the month's record.
    static func keepTotals(_ month: LedgerMonth, export: Export, on connection: PostgresConnection, logger: Logger) async throws {
        _ = try await connection.query(
            """
            INSERT INTO ledger_dropped_totals (company_id, month, period_id, user_id, feature, feature_day, units_grant_id,
                                               cost_grant_id, calls, units, company_units, company_cost_used, company_cost_held,
                                               user_cost_used, user_cost_held, feature_units, grant_units, grant_cost_used,
                                               grant_cost_held)
            SELECT company_id, \(month.firstDay)::date, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id,
                   count(*), sum(units), sum(company_units), sum(company_cost_used), sum(company_cost_held), sum(user_cost_used),
                   sum(user_cost_held), sum(feature_units), sum(grant_units), sum(grant_cost_used), sum(grant_cost_held)
              FROM usage_ledger_charged
             WHERE created_at >= \(month.start) AND created_at < \(month.end)
             GROUP BY company_id, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id
            """, logger: logger
        ).collect()
        _ = try await connection.query(
            """
            INSERT INTO ledger_dropped_months (month, rows, format, sha256, path)
            VALUES (\(month.firstDay)::date, \(export.rows), \(export.format.rawValue), \(export.sha256), \(export.path))
            """, logger: logger
        ).collect()
    }
}
