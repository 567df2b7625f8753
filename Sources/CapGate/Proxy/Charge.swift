import Foundation
import Logging

/// The ledger row of an admitted call: settled with the provider's token counts once it answered
/// 2xx, given back when it did not serve the call.
struct Charge: Sendable {
    let metering: MeteringStore
    let companyID: UUID
    let ledgerID: Int64
    /// This attempt (a retry under the same `Idempotency-Key` is another).
    let requestID: String
    /// What its end gives back in its rate windows (SPEC §14): a token hold, a concurrency slot.
    var windows: RateState.End = .none
    /// Its slot's lease, renewed while the call runs (nil: no slot).
    var lease: SlotLease? = nil

    /// The charge stands: records the provider's status and token counts (queued, not awaited),
    /// which trade the call's token hold in its rate windows for the real count in the same
    /// transaction; a concurrency slot is noted free before the answer ends and written with the
    /// gateway's next admission (``SlotEnds``), so that a caller who saw the answer end finds the
    /// slot free.
    func settle(status: Int, usage: UsageCapture) {
        metering.settle(
            Settlement(
                companyID: companyID, ledgerID: ledgerID, status: Int32(clamping: status), usage: usage.usage,
                endsInWindows: windows.tokens))
        if windows.slot {
            metering.freeSlot(companyID: companyID, ledgerID: ledgerID)
        }
    }

    /// Reports this attempt's failure before the caller is answered: the charge is given back
    /// unless another attempt at it (the same Idempotency-Key) is in flight or succeeded. Returns
    /// whether it was given back now. If the database is unavailable the caller is answered
    /// anyway (false: the outcome is not known yet) once the report is in the spool (it is
    /// idempotent and replayed until the database takes it, across restarts), so a call that
    /// failed upstream while PostgreSQL was down does not stay charged.
    @discardableResult
    func refund(status: Int?, reason: RefundReason, logger: Logger) async -> Bool {
        do {
            guard try await metering.refund(companyID: companyID, ledgerID: ledgerID, requestID: requestID, upstreamStatus: status)
            else { return false }
            GatewayMetrics.refund(reason: reason)
            return true
        } catch DatabaseError.unavailable {
            logger.warning("refund delayed: the database is unavailable; it waits in the spool", metadata: ["ledger_id": "\(ledgerID)"])
            metering.pendingWrites.later(.refund(company: companyID, ledger: ledgerID, requestID: requestID, status: status))
            return false
        } catch {
            // The ledger row stays charged; `capgate verify` and the operator see it.
            logger.error("refund failed", metadata: ["ledger_id": "\(ledgerID)", "reason": "\(reason.rawValue)"])
            return false
        }
    }
}
