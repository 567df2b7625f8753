import Foundation
import Logging
import NIOCore
import PostgresNIO

/// The admission transactions themselves: a batch (or a batch of one) run, its commit
/// acknowledged, and what it charged given back when its callers could not be answered with it.
extension MeteringStore {
    /// Runs one admission transaction for `items`. One call that PostgreSQL rejects (say, a NUL
    /// byte in a text) never fails the others: the batch is then retried call by call. When the
    /// database is unreachable or does not answer within `database.timeout` every call fails (503:
    /// fail closed); a transaction that commits after that, or whose connection broke with the
    /// outcome unknown, has its charges given back (``LateAdmissions``): none of its calls was
    /// forwarded.
    ///
    /// The transaction does not count the slots of calls that ended on this gateway and are not
    /// written yet (`slotEnds`). `answered` is called when the statement has answered and only
    /// the acknowledgement of its commit is awaited (the admission queue starts its next batch);
    /// not when the batch is retried call by call, which holds the next batch up until it ends.
    static func admitBatch(
        _ items: [AdmissionItem], database: Database, relaxed: Bool, spool: Spool? = nil, slotEnds: SlotEnds? = nil,
        answered: (@Sendable () -> Void)? = nil
    ) async -> [Result<AdmissionRow, any Error>] {
        GatewayMetrics.admissionBatch(size: items.count)
        let ended = slotEnds?.excluded() ?? []
        do {
            let started = ContinuousClock.now
            let rows = try await runAdmitBatch(
                items, database: database, relaxed: relaxed, spool: spool, ended: ended, answered: answered)
            GatewayMetrics.admissionBatch(duration: ContinuousClock.now - started)
            return rows.map { .success($0) }
        } catch DatabaseError.unavailable {
            return items.map { _ in .failure(DatabaseError.unavailable) }
        } catch {
            guard items.count > 1 else { return [.failure(error)] }
            // Call by call, the batch holding up the next one until its last call is done.
            // The first call the database cannot take ends it: the rest are answered 503 at once
            // rather than each waiting its own database.timeout while the queue waits behind them.
            var results: [Result<AdmissionRow, any Error>] = []
            results.reserveCapacity(items.count)
            for item in items {
                if case .failure(DatabaseError.unavailable) = results.last {
                    results.append(.failure(DatabaseError.unavailable))
                    continue
                }
                results += await admitBatch([item], database: database, relaxed: relaxed, spool: spool, slotEnds: slotEnds)
            }
            return results
        }
    }

    static func runAdmitBatch(
        _ items: [AdmissionItem], database: Database, relaxed: Bool, spool: Spool?, ended: [Int64] = [],
        answered: (@Sendable () -> Void)? = nil
    ) async throws -> [AdmissionRow] {
        if items.count == 1 {
            return try await runAdmitOne(
                items[0], database: database, relaxed: relaxed, spool: spool, ended: ended, answered: answered)
        }
        return try await runAdmission(
            items, AdmitBatchStatement(items: items, relaxed: relaxed, ended: ended), database: database, spool: spool,
            answered: answered)
    }

    /// Runs an admission statement for `items`. Its rows are the decision, but a call is forwarded
    /// only once PostgreSQL has acknowledged the commit (``Database/write(lateResult:_:)``): a
    /// primary stopped while the commit waits for the synchronous standby answers the rows and
    /// then withholds the acknowledgement, and the charge may be lost with it. A commit after the
    /// deadline, or one not acknowledged (the outcome unknown), has its charges given back
    /// (``LateAdmissions``).
    static func runAdmission<Statement: PostgresPreparedStatement>(
        _ items: [AdmissionItem], _ statement: Statement, database: Database, spool: Spool?,
        answered: (@Sendable () -> Void)? = nil
    ) async throws -> [AdmissionRow] where Statement.Row == AdmissionRow {
        let late = LateAdmissions(items: items, database: database, spool: spool)
        let rows = try await database.write(
            statement: statement, lateResult: late.committedLate, failed: late.interrupted(by:), answered: answered)
        // Committed, but not one row per call: which charge is whose cannot be told, so no call
        // is forwarded and what the ledger holds of them is given back. Never retried call by
        // call (that would charge them again): 503, as for any commit whose outcome is unclear.
        guard rows.count == items.count else {
            database.logger.error(
                "an admission returned a row count other than its calls'; none is forwarded and their charges are given back",
                metadata: ["rows": "\(rows.count)", "calls": "\(items.count)", "request_ids": "\(late.requestIDs)"])
            late.interrupted(by: CommitUnacknowledged(reason: DatabaseError.other("\(rows.count) rows for \(items.count) calls")))
            throw DatabaseError.unavailable
        }
        return rows
    }

    /// A batch of one runs the single-call function (`capgate_admit`, over `capgate_charge`):
    /// same decision, same lock order (period, company counter, user counter, feature counters),
    /// under half the time of the array version with arrays of one (pgbench, one call a
    /// transaction: 0.55 ms against 1.29 ms, session 39), which is what a lone call on an idle
    /// gateway waits for.
    static func runAdmitOne(
        _ item: AdmissionItem, database: Database, relaxed: Bool, spool: Spool?, ended: [Int64] = [],
        answered: (@Sendable () -> Void)? = nil
    ) async throws -> [AdmissionRow] {
        try await runAdmission(
            [item], AdmitStatement(item: item, relaxed: relaxed, ended: ended), database: database, spool: spool,
            answered: answered)
    }
}
