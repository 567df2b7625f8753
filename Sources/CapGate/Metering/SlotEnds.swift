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
final class SlotEnds: Sendable {
    private struct State {
        var pending: [RateEnd] = []
        var flushScheduled = false
        /// The last `capgate_rate_end` write started (finished or not).
        var written: Task<Void, Never>?
    }

    private let state = Mutex(State())
    let database: Database
    /// How long an end waits for an admission to carry it before it is written on its own.
    let gather: Duration

    init(database: Database, gather: Duration = MeteringStore.slotEndGather) {
        self.database = database
        self.gather = gather
    }

    /// Notes that a call's slot is free (its answer ends, or its client left).
    func add(_ end: RateEnd) {
        add([end])
    }

    /// Hands back ends an admission took but did not commit (the transaction failed).
    func add(_ ends: [RateEnd]) {
        guard !ends.isEmpty else { return }
        let schedule = state.withLock { state -> Bool in
            state.pending += ends
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

    /// The ends for an admission transaction about to start: every end noted so far that is not
    /// already written, after a write of the others in flight has ended.
    func take() async -> [RateEnd] {
        let (ends, written) = state.withLock { state in
            defer { state.pending.removeAll(keepingCapacity: true) }
            return (state.pending, state.written)
        }
        await written?.value
        return ends
    }

    /// Writes the ends no admission took (one transaction), and waits for it; a call admitted
    /// outside the admission batches (with an `Idempotency-Key`) waits for it first.
    func flush() async {
        let write = state.withLock { state -> Task<Void, Never>? in
            state.flushScheduled = false
            guard !state.pending.isEmpty else { return state.written }
            let ends = state.pending
            state.pending.removeAll(keepingCapacity: true)
            let previous = state.written
            let database = self.database
            let task = Task {
                await previous?.value
                await Self.write(ends, database: database)
            }
            state.written = task
            return task
        }
        await write?.value
    }

    /// `capgate_rate_end`; on failure the slots come back at their lease (`rate.leaseSeconds`).
    static func write(_ ends: [RateEnd], database: Database) async {
        do {
            try await database.run { client in
                _ = try await client.execute(RateEndStatement(items: ends), logger: database.logger).collect()
            }
        } catch {
            database.logger.warning("could not end calls in their rate windows", metadata: ["calls": "\(ends.count)"])
        }
    }
}
