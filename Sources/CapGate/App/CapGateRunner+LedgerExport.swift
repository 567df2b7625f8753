import Foundation
import Logging

extension CapGateRunner {
    /// `capgate ledger export --month YYYY-MM --to FILE [--format jsonl|csv]`: the month's ledger
    /// rows to FILE (with FILE.sha256), recorded in `ledger_exports`. A month that is malformed
    /// or not over at `now`, or a FILE that exists, is refused (``LedgerExport/Refusal``) before
    /// the database is reached.
    public static func ledgerExport(
        url: DatabaseURL, month: String, to path: String, format: String = "jsonl", now: Date = Date(), logger: Logger
    ) async throws -> LedgerExport.Summary {
        let request = try LedgerExport.Request(month: month, path: path, format: format, now: now)
        return try await withClient(url: url, logger: logger) { client in
            try await LedgerExport(database: Database(client: client, timeout: LedgerExport.timeout, logger: logger)).export(request)
        }
    }
}
