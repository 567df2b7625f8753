import Foundation
import Logging
import PostgresNIO
import Synchronization

/// Concurrency slots of calls that ended on this gateway and are not yet freed in the database
/// (SPEC §14).
///
/// An end is noted in memory before the answer's last byte goes out (``add(_:)``), and rides the
/// gateway's next admission transaction (``take()``, `capgate_slots_free`), which frees the slots
/// before it counts live ones: a call this gateway admits after an answer ended never counts that
/// answer's slot, and no end costs a transaction of its own while the gateway admits. Ends that no
/// admission takes within ``gather`` are written by one `capgate_rate_end` transaction, so the
/// other gateways see them free within milliseconds; an admission waits for such a write in
/// flight, so an end it did not take is committed before it counts.
///
/// (Awaiting a transaction of its own before every last byte cost 15 % of the requests per second
/// at 64 callers and 0.54 ms at one, measured in session 25: the awaited end was the whole cost of
/// the concurrency limit.)
///
/// It carries the same way the token holds this gateway's settlements gave back in the plan windows
/// (``RateGiveBack``, `capgate_settle_batch` with `p_defer`): the next admission batch writes them
/// as it locks those counter rows anyway, or `capgate_rate_end` within ``gather``. Unlike an end, a
/// give-back is not idempotent: one taken by a transaction whose outcome is not known is dropped
/// (the window then counts the hold to the minute's end: never less than the calls took).
final class SlotEnds: Sendable {
    /// What one transaction takes.
    struct Taken: Sendable {
        var ends: [RateEnd] = []
        var giveBacks: [RateGiveBack] = []
    }

    private struct State {
        var pending: [RateEnd] = []
        var giveBacks: [RateGiveBack] = []
        var flushScheduled = false
        /// The last `capgate_rate_end` write started (finished or not).
        var written: Task<Void, Never>?
    }

    private let state = Mutex(State())
    /// The companies of this gateway's last admission when it was a batch of more than one call:
    /// a settlement leaves the give-backs of their calls to the next batch, which most likely
    /// locks their counters anyway (a busy company is in every batch). The others' it writes
    /// itself: a quiet gateway's (a lone call's function carries none, and a transaction of their
    /// own every gather cost +0.27 ms at one caller) and those of companies that come seldom
    /// (a batch locking their rows for them only cost more than the settlement's statement:
    /// 1,000 companies at c=64 went from 0.88 to 0.79 of caps only; session 29).
    private let batched = Mutex(Set<UUID>())
    let database: Database
    /// How long an end waits for an admission to carry it before it is written on its own.
    let gather: Duration

    init(database: Database, gather: Duration = MeteringStore.slotEndGather) {
        self.database = database
        self.gather = gather
    }

    /// Notes the companies of an admission transaction that committed (none for a lone call).
    func admitted(_ rows: [AdmissionRow]) {
        let companies = rows.count > 1 ? Set(rows.compactMap(\.companyID)) : []
        batched.withLock { $0 = companies }
    }

    /// Per settlement: whether its give-backs are left to the next admission batch.
    func defers(_ items: [Settlement]) -> [Bool] {
        let companies = batched.withLock { $0 }
        guard !companies.isEmpty else { return [] }
        return items.map { companies.contains($0.companyID) }
    }

    /// Notes that a call's slot is free (its answer ends, or its client left).
    func add(_ end: RateEnd) {
        add([end])
    }

    /// Hands back ends an admission took but did not commit (the transaction failed).
    func add(_ ends: [RateEnd]) {
        add(Taken(ends: ends))
    }

    /// Notes give-backs (a settlement's), or hands back what a transaction took and certainly did
    /// not commit (the server rolled it back).
    func add(_ taken: Taken) {
        guard !taken.ends.isEmpty || !taken.giveBacks.isEmpty else { return }
        let schedule = state.withLock { state -> Bool in
            state.pending += taken.ends
            state.giveBacks += taken.giveBacks
            defer { state.flushScheduled = true }
            return !state.flushScheduled
        }
        guard schedule else { return }
        let gather = self.gather
        Task {
            try? await Task.sleep(for: gather)
            await self.flush()
        }
    }

    /// What an admission transaction about to start carries: every end and give-back noted so far
    /// and not already written, after a write of the others in flight has ended.
    func take() async -> Taken {
        let (taken, written) = state.withLock { state in
            defer {
                state.pending.removeAll(keepingCapacity: true)
                state.giveBacks.removeAll(keepingCapacity: true)
            }
            return (Taken(ends: state.pending, giveBacks: state.giveBacks), state.written)
        }
        await written?.value
        return taken
    }

    /// Writes the ends no admission took (one transaction), and waits for it; a call admitted
    /// outside the admission batches (with an `Idempotency-Key`) waits for it first.
    func flush() async {
        let write = state.withLock { state -> Task<Void, Never>? in
            state.flushScheduled = false
            guard !state.pending.isEmpty || !state.giveBacks.isEmpty else { return state.written }
            let taken = Taken(ends: state.pending, giveBacks: state.giveBacks)
            state.pending.removeAll(keepingCapacity: true)
            state.giveBacks.removeAll(keepingCapacity: true)
            let previous = state.written
            let database = self.database
            let task = Task {
                await previous?.value
                await Self.write(taken, database: database)
            }
            state.written = task
            return task
        }
        await write?.value
    }

    /// `capgate_rate_end`; on failure the slots come back at their lease (`rate.leaseSeconds`) and
    /// the windows keep the holds to the minute's end.
    static func write(_ taken: Taken, database: Database) async {
        do {
            try await database.run { client in
                _ = try await client.execute(RateEndStatement(items: taken.ends, giveBacks: taken.giveBacks), logger: database.logger)
                    .collect()
            }
        } catch {
            database.logger.warning(
                "could not end calls in their rate windows",
                metadata: ["calls": "\(taken.ends.count)", "give_backs": "\(taken.giveBacks.count)"])
        }
    }
}
