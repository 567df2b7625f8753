import Foundation
import Logging
import PostgresNIO
import Synchronization

/// Concurrency slots of calls that ended on this gateway and are not yet freed in the database
/// (SPEC §14).
///
/// An end is noted in memory before the answer's last byte goes out (``add(_:)``); the ends noted
/// within ``gather`` are written together by one `capgate_rate_end` transaction, off the
/// admissions' path, so the other gateways see them free within milliseconds. Until that write
/// has finished, every admission of this gateway passes their ledger ids (``excluded()``) and does
/// not count their rows: a call this gateway admits after an answer ended never counts that
/// answer's slot, and no admission waits for a write or deletes a row itself.
///
/// (Awaiting a transaction of its own before every last byte cost 15 % of the requests per second
/// at 64 callers and 0.54 ms at one, measured in session 25: the awaited end was the whole cost of
/// the concurrency limit. From session 26 to 30 the ends rode the next admission transaction, which
/// deleted the rows before it counted: 0.3 ms of a ~5.5 ms batch on the transaction every caller
/// waits for.)
///
/// It also keeps the leases of the slots its calls hold while they run (``taken(companyID:ledgerID:)``,
/// ``renew(leaseSeconds:)``): a call that streams for longer than `rate.leaseSeconds` keeps its
/// slot, which only a gateway that dies loses at its lease (SPEC §14).
final class SlotEnds: Sendable {
    private struct State {
        /// Noted, not yet in a write.
        var pending: [RateEnd] = []
        /// In a write not finished yet, by write.
        var writing: [Int: [RateEnd]] = [:]
        var writes = 0
        var flushScheduled = false
        /// The last `capgate_rate_end` or lease renewal started (finished or not).
        var written: Task<Void, Never>?
        /// End writes failed in a row (reset by one that commits).
        var failures = 0
        /// The calls holding a slot on this gateway now, by ledger id: company, last renewal.
        var live: [Int64: (company: UUID, renewed: ContinuousClock.Instant)] = [:]
    }

    private let state = Mutex(State())
    let database: Database
    /// How long an end waits for an admission to carry it before it is written on its own.
    let gather: Duration
    /// How long ends whose write failed wait before they are written again.
    let retry: Duration

    init(database: Database, gather: Duration = MeteringStore.slotEndGather, retry: Duration = .seconds(1)) {
        self.database = database
        self.gather = gather
        self.retry = retry
    }

    /// Notes that a call's slot is free (its answer ends, or its client left).
    func add(_ end: RateEnd) {
        add([end])
    }

    /// Notes that calls' slots are free.
    func add(_ ends: [RateEnd]) {
        guard !ends.isEmpty else { return }
        state.withLock { state in
            for end in ends { state.live.removeValue(forKey: end.ledgerID) }
            state.pending += ends
        }
        scheduleFlush(after: gather)
    }

    /// A flush of the noted ends after `delay`, unless one is already due.
    private func scheduleFlush(after delay: Duration) {
        let schedule = state.withLock { state -> Bool in
            defer { state.flushScheduled = true }
            return !state.flushScheduled
        }
        guard schedule else { return }
        Task {
            try? await Task.sleep(for: delay)
            await self.flush()
        }
    }

    /// The ledger ids of the calls whose end is noted and not yet written (noted, or in a write not
    /// finished): an admission starting now does not count their slots.
    func excluded() -> [Int64] {
        state.withLock { state in
            var ids = state.pending.map(\.ledgerID)
            for ends in state.writing.values { ids += ends.lazy.map(\.ledgerID) }
            return ids
        }
    }

    /// Writes the noted ends (one transaction) and waits for it, and for a write in flight; a
    /// call admitted outside the admission batches (with an `Idempotency-Key`) waits for it
    /// first, and so do the usage reads.
    func flush() async {
        let write = state.withLock { state -> Task<Void, Never>? in
            state.flushScheduled = false
            guard !state.pending.isEmpty else { return state.written }
            let ends = state.pending
            state.pending.removeAll(keepingCapacity: true)
            state.writes += 1
            let number = state.writes
            state.writing[number] = ends
            let previous = state.written
            let database = self.database
            let task = Task {
                await previous?.value
                let written = await Self.write(ends, database: database)
                // Written: the admissions count what the rows say. Not written (the database
                // failed or did not answer): noted again, still not counted by this gateway's
                // admissions, and written again shortly (an end written twice changes nothing),
                // for up to ``retries`` failures in a row; then left to their lease.
                let again = self.state.withLock { state -> Bool in
                    state.writing.removeValue(forKey: number)
                    state.failures = written ? 0 : state.failures + 1
                    guard !written, state.failures <= Self.retries else { return false }
                    state.pending += ends
                    return true
                }
                if again { self.scheduleFlush(after: self.retry) }
            }
            state.written = task
            return task
        }
        await write?.value
    }

    /// End writes that may fail in a row before their ends are left to their lease.
    static let retries = 120

    /// `capgate_rate_end`; whether it committed.
    static func write(_ ends: [RateEnd], database: Database) async -> Bool {
        do {
            _ = try await database.write(statement: RateEndStatement(items: ends))
            return true
        } catch {
            database.logger.warning(
                "could not end calls in their rate windows; written again shortly", metadata: ["calls": "\(ends.count)"])
            return false
        }
    }
}

extension SlotEnds {
    /// Notes that a call admitted on this gateway holds a slot: its lease is renewed until its end
    /// is noted or the returned lease is gone (the last copy of its charge).
    func taken(companyID: UUID, ledgerID: Int64) -> SlotLease {
        state.withLock { $0.live[ledgerID] = (companyID, ContinuousClock.now) }
        return SlotLease(ends: self, ledgerID: ledgerID)
    }

    /// Stops renewing a call's lease (its charge is gone without an end: the slot is left to
    /// its lease).
    func forget(_ ledgerID: Int64) {
        _ = state.withLock { $0.live.removeValue(forKey: ledgerID) }
    }

    /// Extends to `leaseSeconds` from now the leases of the slots held for at least a quarter of
    /// it since their admission or last renewal (one statement; run every quarter lease, so a
    /// lease never has less than half of it left). Runs in turn with the end writes, and the
    /// admissions that carry ends wait for it: a slot row this holds is never one an end skips.
    /// (A call whose end is noted is no longer renewed.)
    func renew(leaseSeconds: Int) async {
        let now = ContinuousClock.now
        let due = Duration.seconds(leaseSeconds) / 4
        let database = self.database
        let write = state.withLock { state -> Task<Void, Never>? in
            let calls = state.live.filter { now - $0.value.renewed >= due }.map { RateEnd(companyID: $0.value.company, ledgerID: $0.key) }
            guard !calls.isEmpty else { return nil }
            let previous = state.written
            let task = Task {
                await previous?.value
                if await Self.renew(calls, seconds: leaseSeconds, database: database) { self.renewed(calls, at: now) }
            }
            state.written = task
            return task
        }
        await write?.value
    }

    private func renewed(_ calls: [RateEnd], at instant: ContinuousClock.Instant) {
        state.withLock { state in
            for call in calls where state.live[call.ledgerID] != nil { state.live[call.ledgerID]?.renewed = instant }
        }
    }

    private static func renew(_ calls: [RateEnd], seconds: Int, database: Database) async -> Bool {
        let companies = calls.map(\.companyID)
        let ledgers = calls.map(\.ledgerID)
        let seconds = Int32(clamping: seconds)
        do {
            try await database.write { connection in
                _ = try await connection.query(
                    """
                    UPDATE rate_calls r SET lease_until = greatest(r.lease_until, clock_timestamp() + make_interval(secs => \(seconds)))
                      FROM unnest(\(companies)::uuid[], \(ledgers)::int8[]) AS s(c, l)
                     WHERE r.company_id = s.c AND r.ledger_id = s.l
                    """,
                    logger: database.logger
                ).collect()
            }
            return true
        } catch {
            database.logger.warning("could not renew the leases of calls in flight", metadata: ["calls": "\(calls.count)"])
            return false
        }
    }
}

/// A call's concurrency slot while its charge exists (SPEC §14): renewed by ``SlotEnds`` until
/// the call's end is noted; when the last copy of the charge goes without one, renewal stops and
/// the slot is left to its lease.
final class SlotLease: Sendable {
    let ends: SlotEnds
    let ledgerID: Int64

    init(ends: SlotEnds, ledgerID: Int64) {
        self.ends = ends
        self.ledgerID = ledgerID
    }

    deinit { ends.forget(ledgerID) }
}
