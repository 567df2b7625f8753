import Foundation
import Logging

extension CapGateRunner {
    /// `capgate ledger drop --month YYYY-MM`: the month's partition detached and dropped under
    /// retention's rules (``LedgerRetention``), with `retention` as `ledger.retentionMonths` says.
    /// A malformed month is refused before the database is reached; every refusal changes nothing.
    public static func ledgerDrop(
        url: DatabaseURL, month text: String, retention: Int?, now: Date = Date(), logger: Logger
    ) async throws -> LedgerRetention.Dropped {
        guard let month = LedgerMonth(text) else { throw LedgerRetention.Refusal.malformedMonth(text) }
        return try await withClient(url: url, logger: logger) { client in
            let database = Database(client: client, timeout: LedgerExport.timeout, logger: logger)
            return try await LedgerRetention(database: database).drop(month, retention: retention, now: now)
        }
    }
}
