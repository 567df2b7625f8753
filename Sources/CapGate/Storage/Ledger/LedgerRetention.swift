import Foundation
import Logging
import PostgresNIO

/// Retention of the ledger's months (`ledger.retentionMonths`, SPEC §7; issue #50 item 2;
/// docs/ledger.md#retention): a month's partition `usage_ledger_pYYYYMM` is detached and dropped
/// when the month is wholly past the retention, an export of it (``LedgerExport``, recorded in
/// `ledger_exports`) still matches its rows, and no row of it is an unsettled charge.
///
/// What `capgate verify` sums of the month's charged rows is kept in `ledger_dropped_totals`
/// (migration 0027) in the drop's transaction, so verify still checks every counter.
///
/// Run by `capgate ledger drop --month` (one month, refusals thrown) and, for every month past the
/// retention, by the gateway's hourly ledger job and `capgate rollover` (``enforce(retention:now:)``,
/// refusals returned).
public struct LedgerRetention: Sendable {
    /// Two drops at once (gateways' jobs, an operator) would queue on each other's table locks:
    /// the later one finds this advisory lock held and is refused as busy instead.
    static let lockKey: Int64 = 0x4361_7047_6174_6503

    /// How long the drop waits for each table lock before it gives up (this round only): the
    /// detach waits behind the longest statement reading the ledger, and every admission queues
    /// behind a waiting detach, so the wait is kept as short as the partitions' own.
    static let lockTimeout = "1s"

    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// How many months `month` lies before the month containing `now` (UTC): 0 for the current
    /// month, 1 for the one before, negative for a month to come.
    public static func age(of month: LedgerMonth, now: Date) -> Int {
        let current = LedgerMonth(containing: now)
        return (current.year * 12 + current.month) - (month.year * 12 + month.month)
    }

    /// Whether `month` is past a retention of `retention` whole months at `now`: the current month
    /// is month 0 and is always kept, with the `retention` months before it; the month before those
    /// is the newest that may go.
    public static func isPast(_ month: LedgerMonth, retention: Int, now: Date) -> Bool {
        age(of: month, now: now) > retention
    }

    /// Drops `month` or throws the ``Refusal`` that names why not; nothing is changed when refused.
    public func drop(_ month: LedgerMonth, retention: Int?, now: Date = Date()) async throws -> Dropped {
        guard let retention else { throw Refusal.retentionUnset }
        guard Self.isPast(month, retention: retention, now: now) else { throw Refusal.withinRetention(month, retention: retention) }
        try await LedgerExport(database: database).checkColumns()
        let partition = Self.partition(month)
        let state = try await read(month, partition: partition)
        if let droppedAt = state.droppedAt { throw Refusal.alreadyDropped(month, at: droppedAt) }
        guard state.held else {
            if state.defaultRows > 0 { throw Refusal.inDefaultPartition(month, rows: state.defaultRows) }
            throw Refusal.notHeld(month)
        }
        guard !state.exports.isEmpty else { throw Refusal.notExported(month) }
        let logger = self.logger
        return try await database.run { client in
            try await client.withConnection { connection in
                try await Self.drop(month, partition: partition, exports: state.exports, on: connection, logger: logger)
            }
        }
    }

    /// Tries every month held past `retention` at `now`, oldest first: what each gave.
    public func enforce(retention: Int, now: Date = Date()) async throws -> [Outcome] {
        var outcomes: [Outcome] = []
        for month in try await heldMonths() where Self.isPast(month, retention: retention, now: now) {
            do {
                outcomes.append(.dropped(try await drop(month, retention: retention, now: now)))
            } catch let refusal as Refusal {
                outcomes.append(.refused(month, refusal))
            }
        }
        return outcomes
    }

    /// The months whose partition is attached to the ledger, oldest first.
    func heldMonths() async throws -> [LedgerMonth] {
        let logger = self.logger
        let names = try await database.run { client in
            try await client.query(
                """
                SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'usage_ledger'::regclass AND c.relname ~ '^usage_ledger_p[0-9]{6}$'
                """, logger: logger
            ).decode(String.self).collect()
        }
        return names.compactMap(Self.month(ofPartition:)).sorted()
    }

    /// `usage_ledger_pYYYYMM`.
    static func partition(_ month: LedgerMonth) -> String {
        "usage_ledger_p" + month.description.replacingOccurrences(of: "-", with: "")
    }

    /// The month a partition's name gives, nil for any other name.
    static func month(ofPartition name: String) -> LedgerMonth? {
        guard name.hasPrefix("usage_ledger_p"), name.count == 20 else { return nil }
        let digits = name.dropFirst(14)
        return LedgerMonth(String(digits.prefix(4)) + "-" + String(digits.suffix(2)))
    }
}

extension LedgerRetention {
    /// A month dropped: its rows, and the export the drop relied on.
    public struct Dropped: Sendable, Equatable, CustomStringConvertible {
        public let month: LedgerMonth
        public let rows: Int64
        public let format: String
        public let sha256: String
        /// Where the export was written, as `ledger_exports` recorded it.
        public let path: String

        /// The line `capgate ledger drop` prints.
        public var description: String {
            "dropped \(month): \(rows) rows (partition \(LedgerRetention.partition(month))); its export is \(path) "
                + "(\(format), sha256 \(sha256))"
        }
    }

    /// What enforcing the retention did with one month.
    public enum Outcome: Sendable, Equatable {
        case dropped(Dropped)
        case refused(LedgerMonth, Refusal)
    }

    /// Why a month was not dropped; nothing changed (`capgate ledger drop` exits 2).
    public enum Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        case malformedMonth(String)
        /// `ledger.retentionMonths` is not set: every month is kept.
        case retentionUnset
        case withinRetention(LedgerMonth, retention: Int)
        case alreadyDropped(LedgerMonth, at: Date)
        /// No partition of the month is attached to the ledger (and none of its rows is held).
        case notHeld(LedgerMonth)
        /// The month has no partition, and rows of it sit in `usage_ledger_default`.
        case inDefaultPartition(LedgerMonth, rows: Int64)
        case notExported(LedgerMonth)
        /// No export of the month matches its rows now: rows were added, changed or removed since.
        case exportStale(LedgerMonth, exported: [String], now: [String])
        case unsettled(LedgerMonth, charges: Int64)
        /// Another drop holds the drop's lock, or a table lock was not had within a second.
        case busy(LedgerMonth, String)

        public var description: String {
            switch self {
            case .malformedMonth(let text): "refused: --month \(text) is not a month as YYYY-MM (such as 2026-01)"
            case .retentionUnset:
                "refused: ledger.retentionMonths (LEDGER_RETENTION_MONTHS) is not set, so every month is kept; set it to drop months"
            case .withinRetention(let month, let retention):
                "refused: \(month) is within the retention (ledger.retentionMonths \(retention): the current month and the "
                    + "\(retention) before it are kept)"
            case .alreadyDropped(let month, let at): "refused: \(month) was dropped already, at \(Timestamp.format(at))"
            case .notHeld(let month): "refused: the ledger holds no partition of \(month) and no row of it; nothing to drop"
            case .inDefaultPartition(let month, let rows):
                "refused: \(rows) rows of \(month) are in usage_ledger_default and the month has no partition; make it with "
                    + "SELECT capgate_ledger_partitions_ahead(0, '\(month.firstDay)Z'), export the month, then drop it"
            case .notExported(let month):
                "refused: \(month) is not exported; run capgate ledger export --month \(month) --to FILE first"
            case .exportStale(let month, let exported, let now):
                "refused: the export of \(month) is stale: it holds \(exported.joined(separator: "; ")), the month's rows now give "
                    + "\(now.joined(separator: "; ")); export it again"
            case .unsettled(let month, let charges):
                "refused: \(month) holds \(charges) unsettled charges (capgate unsettled lists them); settle, keep or refund them first"
            case .busy(let month, let why): "refused: \(month) not dropped now: \(why); try again"
            }
        }
    }
}
