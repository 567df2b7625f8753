import Foundation
import Logging
import PostgresNIO

/// The ledger's rollups (migration 0028; docs/ledger.md#rollups): the charged rows summed per
/// company, quarter hour, period, feature and model, kept by the ledger's statement triggers in
/// the transaction of every change. The triggers append what each statement changed to
/// `usage_rollup_changes`; ``compact()`` moves those into `usage_rollups`, so that a read sums a
/// few rows per quarter hour, not one per call.
public struct LedgerRollups: Sendable {
    let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// Moves the changes committed so far into the rollups; returns how many it moved (0 when
    /// another gateway's compaction was under way). Nothing acts on its commit: a compaction lost
    /// with a primary leaves its changes where they were, and the next one moves them.
    @discardableResult
    public func compact() async throws -> Int64 {
        try await database.run { client in
            let rows = try await client.query("SELECT capgate_rollup_compact()", logger: database.logger)
            for try await moved in rows.decode(Int64.self) { return moved }
            return 0
        }
    }

    /// The gateway's job: every `interval`; a failed round (a standby, the database away) is
    /// logged at debug and the next one tries again (the changes wait, and the reads count them).
    func job(interval: Duration, logger: Logger) -> PeriodicJob {
        PeriodicJob(interval: interval) {
            do {
                try await compact()
            } catch {
                logger.debug(
                    "ledger rollups not compacted; the next round tries again", metadata: ["error": "\(String(describing: error))"])
            }
        }
    }
}
