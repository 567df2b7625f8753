import Foundation
import Logging
import PostgresNIO

/// Settlements (SPEC §11, §14): queued after each answer, written in batches
/// (`capgate_settle_batch`) while the callers move on.
extension MeteringStore {
    /// Records the upstream status and usage on a charge that stands and settles its cost (its
    /// hold traded for what the usage cost, or kept as its cost when the usage is not known).
    /// Queued, not awaited: the charge and its hold were committed by the admission, and an open
    /// hold is never less than the call may cost; settlements are written in batches
    /// (`capgate_settle_batch`) while the caller moves on.
    public func settle(companyID: UUID, ledgerID: Int64, upstreamStatus: Int, usage: ProviderUsage) {
        settle(Settlement(companyID: companyID, ledgerID: ledgerID, status: Int32(clamping: upstreamStatus), usage: usage))
    }

    func settle(_ settlement: Settlement) {
        settlements.enqueue(settlement)
    }

    /// Logs and counts the settled calls that cost more than their hold: the provider billed past
    /// the bound (more prompt overhead than `costs.promptOverheadTokens`, a price raised since).
    static func report(_ overHolds: [OverHold], logger: Logger) {
        for over in overHolds {
            GatewayMetrics.costOverHold()
            logger.warning(
                "a call cost more than its hold",
                metadata: [
                    "company_id": "\(over.companyID.uuidString.lowercased())", "ledger_id": "\(over.ledgerID)",
                    "hold_usd": "\(Micros(over.hold).decimal)", "cost_usd": "\(Micros(over.cost).decimal)",
                ])
        }
    }

    /// Returns once every settlement queued so far is written, with the token holds it gave back:
    /// a ledger or window read after it sees the provider status and token counts of every call
    /// this gateway answered before.
    public func settledSoFar() async {
        await settlements.processedSoFar()
        await slotEnds.flush()
    }

    /// Waits until every queued settlement and every noted slot end is written (graceful
    /// shutdown, tests): a gateway stopped right after an answer ended must not leave its slot
    /// taken until the lease.
    public func flush() async {
        await settlements.flush()
        await slotEnds.flush()
    }

    /// Writes a batch of settlements; with `slotEnds`, the token holds the calls of companies in
    /// the gateway's last admission batch give back in the plan windows are left to it (written
    /// with its next admission batch), not written here (``SlotEnds/defers(_:)``).
    static func settleBatch(
        _ items: [Settlement], database: Database, spool: Spool? = nil, slotEnds: SlotEnds? = nil
    ) async -> [Result<Void, any Error>] {
        do {
            let statement = SettleBatchStatement(items: items, deferred: slotEnds?.defers(items) ?? [])
            let rows = try await database.run { client in
                try await client.execute(statement, logger: database.logger).collect()
            }
            var over: [OverHold] = []
            var giveBacks: [RateGiveBack] = []
            for row in rows {
                switch row {
                case .overHold(let o): over.append(o)
                case .giveBack(let g): giveBacks.append(g)
                }
            }
            report(over, logger: database.logger)
            slotEnds?.add(SlotEnds.Taken(giveBacks: giveBacks))
            return items.map { _ in .success(()) }
        } catch DatabaseError.unavailable where spool != nil {
            // The charges stand; their token counts wait in the spool until the database is back.
            let writes = PendingWrites(database: database, spool: spool)
            for item in items {
                let usage = item.usage
                writes.later(
                    .settle(
                        company: item.companyID, ledger: item.ledgerID, status: item.status, inputTokens: usage.inputTokens,
                        outputTokens: usage.outputTokens, cacheWrite5m: usage.cacheWrite5m, cacheWrite1h: usage.cacheWrite1h,
                        cacheRead: usage.cacheRead, known: usage.known))
            }
            return items.map { _ in .failure(DatabaseError.unavailable) }
        } catch {
            // The charges stand; only their token counts are missing (the ledger shows settled_at NULL).
            database.logger.error("could not record token counts", metadata: ["calls": "\(items.count)"])
            return items.map { _ in .failure(error) }
        }
    }
}
