import Foundation
import Logging
import PostgresNIO

/// `capgate ledger export`: one whole UTC month of `usage_ledger` written to a file (JSON lines
/// or CSV, ``LedgerRowEncoder``), streamed from PostgreSQL in constant memory, with its row count
/// and SHA-256, and recorded in `ledger_exports`, which retention (`ledger.retentionMonths`,
/// SPEC §7, ``LedgerRetention``) requires, still matching the month's rows, before it drops a month.
///
/// Every column is written, rows ordered by (`created_at`, `company_id`, `id`), each value as
/// text in one fixed form: the same ledger gives the same bytes on every run.
public struct LedgerExport: Sendable {
    /// Every column of `usage_ledger`, in the table's order. An export refuses a ledger whose
    /// columns differ (a database migrated by another CapGate), so a month is never archived
    /// without one of them.
    static let columns: [LedgerColumn] = [
        .init(name: "company_id", kind: .text), .init(name: "id", kind: .integer), .init(name: "period_id", kind: .integer),
        .init(name: "user_id", kind: .text), .init(name: "units", kind: .integer), .init(name: "input_tokens", kind: .integer),
        .init(name: "output_tokens", kind: .integer), .init(name: "method", kind: .text), .init(name: "route", kind: .text),
        .init(name: "model", kind: .text), .init(name: "feature", kind: .text), .init(name: "request_id", kind: .text),
        .init(name: "idempotency_key", kind: .text), .init(name: "outcome", kind: .text),
        .init(name: "upstream_status", kind: .integer), .init(name: "created_at", kind: .timestamp),
        .init(name: "settled_at", kind: .timestamp), .init(name: "feature_day", kind: .timestamp),
        .init(name: "cache_write_5m_tokens", kind: .integer), .init(name: "cache_write_1h_tokens", kind: .integer),
        .init(name: "cache_read_tokens", kind: .integer), .init(name: "hold_micros", kind: .integer),
        .init(name: "cost_micros", kind: .integer), .init(name: "cost_source", kind: .text),
        .init(name: "rate_minute", kind: .timestamp), .init(name: "rate_tokens", kind: .integer),
        .init(name: "rate_scopes", kind: .integer), .init(name: "units_grant_id", kind: .integer),
        .init(name: "cost_grant_id", kind: .integer), .init(name: "units_grant_part", kind: .integer),
        .init(name: "cost_grant_part", kind: .integer),
    ]

    /// How long an export may run (one statement streams the whole month).
    public static let timeout = Duration.seconds(86_400)

    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// Exports `request`'s month, records it in `ledger_exports`, and tells what was written.
    public func export(_ request: Request) async throws -> Summary {
        try await checkColumns()
        try await checkHeld(request.month)
        let logger = self.logger
        let (rows, written) = try await database.run { client in try await Self.write(request, client: client, logger: logger) }
        let summary = Summary(request: request, rows: rows, bytes: written.bytes, sha256: written.sha256)
        try await record(summary)
        return summary
    }

    /// Streams the month's rows into the file: one row at a time from PostgresNIO's row
    /// sequence (which reads from the socket only as rows are taken) into ``ExportFile``'s
    /// buffer. On any failure the partial file is removed.
    static func write(_ request: Request, client: PostgresClient, logger: Logger) async throws -> (Int64, ExportFile.Written) {
        let encoder = LedgerRowEncoder(format: request.format, columns: columns)
        var file = try ExportFile(path: request.absolutePath)
        do {
            let rows = try await client.query(query(request.month), logger: logger)
            encoder.header(into: &file.buffer)
            var count: Int64 = 0
            for try await row in rows {
                encoder.row(row, into: &file.buffer)
                try file.flushIfFull()
                count += 1
            }
            return (count, try file.finish())
        } catch {
            file.abandon()
            throw error
        }
    }

    /// The month's rows, every column as text (``LedgerColumn/selected``), in a fixed order.
    static func query(_ month: LedgerMonth) -> PostgresQuery {
        let select = columns.map(\.selected).joined(separator: ", ")
        return """
            SELECT \(unescaped: select) FROM usage_ledger
             WHERE created_at >= \(month.start) AND created_at < \(month.end)
             ORDER BY created_at, company_id, id
            """
    }

    /// Refuses a month that retention dropped (`ledger_dropped_months`): its export would hold
    /// none of its rows, and would replace in `ledger_exports` the record of the file that does.
    func checkHeld(_ month: LedgerMonth) async throws {
        let logger = self.logger
        let dropped = try await database.run { client in
            try await client.query("SELECT path FROM ledger_dropped_months WHERE month = \(month.firstDay)::date", logger: logger)
                .decode(String.self).collect().first
        }
        if let dropped { throw Refusal.monthDropped(month, export: dropped) }
    }

    /// Refuses a ledger whose columns are not exactly ``columns``.
    func checkColumns() async throws {
        let logger = self.logger
        let names = try await database.run { client in
            try await client.query(
                """
                SELECT column_name::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = 'usage_ledger'
                """, logger: logger
            ).decode(String.self).collect()
        }
        let known = Set(Self.columns.map(\.name))
        let unknown = names.filter { !known.contains($0) }.sorted()
        let missing = known.subtracting(names).sorted()
        guard unknown.isEmpty && missing.isEmpty else { throw Refusal.columnsDiffer(unknown: unknown, missing: missing) }
    }

    /// Records a finished export; a later export of the same month and format replaces the row.
    func record(_ summary: Summary) async throws {
        let logger = self.logger
        let request = summary.request
        try await database.transaction { connection in
            _ = try await connection.query(
                """
                INSERT INTO ledger_exports (month, format, rows, bytes, sha256, path)
                VALUES (\(request.month.firstDay)::date, \(request.format.rawValue), \(summary.rows), \(summary.bytes),
                        \(summary.sha256), \(request.absolutePath))
                ON CONFLICT (month, format) DO UPDATE
                   SET rows = excluded.rows, bytes = excluded.bytes, sha256 = excluded.sha256, path = excluded.path,
                       exported_at = excluded.exported_at
                """, logger: logger)
        }
    }
}

extension LedgerExport {
    /// An export to run, checked before anything is read or written.
    public struct Request: Sendable {
        public let month: LedgerMonth
        public let format: LedgerExportFormat
        /// The file as it was named.
        public let path: String
        /// The file from `/` (what `ledger_exports` records).
        public let absolutePath: String

        /// Refuses a month that is not `YYYY-MM` or has not ended at `now`, a format other
        /// than `jsonl` or `csv`, and a file (or its `.partial`) that exists.
        public init(month text: String, path: String, format: String = "jsonl", now: Date = Date()) throws {
            guard let month = LedgerMonth(text) else { throw Refusal.malformedMonth(text) }
            guard month.end <= now else { throw Refusal.monthNotEnded(month) }
            guard let format = LedgerExportFormat(rawValue: format) else { throw Refusal.unknownFormat(format) }
            let absolute = URL(fileURLWithPath: path).standardizedFileURL.path
            for candidate in [absolute, absolute + ".partial"] where FileManager.default.fileExists(atPath: candidate) {
                throw Refusal.fileExists(candidate == absolute ? path : path + ".partial")
            }
            self.month = month
            self.format = format
            self.path = path
            self.absolutePath = absolute
        }
    }

    /// What an export wrote.
    public struct Summary: Sendable, CustomStringConvertible {
        public let request: Request
        public let rows: Int64
        public let bytes: Int64
        /// The SHA-256 of the file's bytes, lower-case hex.
        public let sha256: String

        /// The line `capgate ledger export` prints.
        public var description: String {
            "exported \(rows) rows of \(request.month) to \(request.path), sha256 \(sha256)"
        }
    }

    /// Why an export was refused before anything was written (`capgate ledger export` exits 2).
    public enum Refusal: Error, Sendable, Equatable, CustomStringConvertible {
        case malformedMonth(String)
        case monthNotEnded(LedgerMonth)
        case unknownFormat(String)
        case fileExists(String)
        /// The ledger's columns are not the ones this binary writes.
        case columnsDiffer(unknown: [String], missing: [String])
        /// Retention dropped the month; its export is the file named.
        case monthDropped(LedgerMonth, export: String)

        public var description: String {
            switch self {
            case .malformedMonth(let text): "refused: --month \(text) is not a month as YYYY-MM (such as 2026-01)"
            case .monthNotEnded(let month): "refused: \(month) has not ended yet (UTC); only a whole month is exported"
            case .unknownFormat(let text): "refused: --format \(text) is not jsonl or csv"
            case .fileExists(let path): "refused: \(path) exists; nothing was written"
            case .monthDropped(let month, let export):
                "refused: \(month) was dropped from the ledger by retention; its export is \(export); nothing was written"
            case .columnsDiffer(let unknown, let missing):
                "refused: usage_ledger's columns are not those this capgate exports (unknown: "
                    + "\(unknown.isEmpty ? "none" : unknown.joined(separator: ", ")), missing: "
                    + "\(missing.isEmpty ? "none" : missing.joined(separator: ", "))); export with the capgate that migrated the database"
            }
        }
    }
}
