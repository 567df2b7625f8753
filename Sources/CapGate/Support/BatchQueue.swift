import NIOCore
import NIOPosix
import Synchronization

/// Group commit: while one batch is being processed, arriving items queue; when it finishes,
/// everything queued (up to `maxBatch`) goes into the next batch. There is no timer: an item
/// that arrives while nothing is in flight starts a batch of one at once, so an idle gateway
/// adds no wait, and a busy one makes batches as large as the traffic that arrived during the
/// previous batch.
///
/// `process` receives the items in arrival order and returns one result per item, in the same
/// order. At most one batch is in flight per queue, unless the queue overlaps at the answer
/// (``init(maxBatch:waitLimit:queueLimit:rejection:late:overlapsAtAnswer:process:)``): then the
/// next batch may start once the current one called its ``BatchRelease`` (its statement
/// answered, only the acknowledgement of its commit is awaited), and at most one batch is ever
/// before its release. Callers are answered when `process` returns, in either case.
///
/// Waits are bounded: a submitted item that has waited `waitLimit` since it arrived gives up
/// (its caller gets ``BatchQueueRejection/waitedTooLong``) however long the queue, and is dropped
/// from the queue; one that was already taken into a batch still in flight has that batch's
/// result handed to `late` instead. At most `queueLimit` submitted items wait at once; past it a
/// caller gets ``BatchQueueRejection/queueFull`` at once.
public final class BatchQueue<Item: Sendable, Output: Sendable>: Sendable {
    private struct Entry: Sendable {
        let item: Item
        /// The key of its ``Waiter`` in `State.waiters`; 0 for fire-and-forget items (``enqueue(_:)``).
        var id: UInt64 = 0
    }

    /// A caller of ``submit(_:)`` whose item queued. Whoever removes it from `State.waiters` (the
    /// batch's result, or its wait limit) resumes it.
    private struct Waiter: Sendable {
        let continuation: CheckedContinuation<Output, any Error>
        /// The event loop the submitter ran on: its result is handed over there, so the caller
        /// continues on its own loop (with its own connections) instead of every caller of a
        /// batch continuing on the loop that ran the batch.
        let loop: (any EventLoop)?
        /// Taken into a batch (no longer counted against `queueLimit`).
        var taken = false
    }

    private struct State: Sendable {
        /// Items waiting for a batch, in arrival order; submitted items that gave up stay here
        /// (their waiter gone) until the next batch skips them.
        var pending: [Entry] = []
        var waiters: [UInt64: Waiter] = [:]
        var lastID: UInt64 = 0
        /// Submitted items in `pending` whose caller still waits.
        var waiting = 0
        var running = false
        /// Waiting in ``flush()`` for the queue to empty.
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        /// Items queued (``enqueue(_:)`` and queued ``submit(_:)``s) and, of those, processed so
        /// far: batches run in arrival order, so every item up to `processed` is done.
        var queued = 0
        var processed = 0
        /// Waiting in ``processedSoFar()`` for `processed` to reach their mark.
        var markWaiters: [(mark: Int, continuation: CheckedContinuation<Void, Never>)] = []
        var batches = 0
        var items = 0
        var largest = 0
        var expired = 0
        var rejected = 0
        /// The wait limits of submitted items, in arrival order (so in deadline order); entries of
        /// items answered since stay until a sweep reaches them. From `deadlinesHead` on.
        var deadlines: [(id: UInt64, at: NIODeadline)] = []
        var deadlinesHead = 0
        /// A sweep (``sweep(on:)``) is scheduled at the first unanswered entry's deadline.
        var sweepArmed = false
    }

    private let state = Mutex(State())
    private let maxBatch: Int
    private let gather: Duration
    private let pace: Duration
    private let waitLimit: Duration?
    private let queueLimit: Int
    private let rejection: @Sendable (BatchQueueRejection) -> any Error
    private let late: Late?
    private let overlapsAtAnswer: Bool
    private let process: ReleasingProcess

    /// - Parameters:
    ///   - gather: for fire-and-forget items (``enqueue(_:)``) only: how long an item arriving
    ///     at an idle queue waits for company before its batch starts. Nobody waits on such
    ///     items, so a short wait turns many small transactions into one. Items submitted with
    ///     ``submit(_:)`` never wait for it.
    ///   - pace: the least time from the start of one batch to the start of the next (zero: the
    ///     next starts as soon as one ends). Fewer, larger batches when the transaction's cost is
    ///     mostly per batch and nobody waits for its items.
    ///   - waitLimit: the longest a submitted item that queued waits, from its arrival, for its
    ///     result; nil: no limit. (An item processed at once by its own caller is not queued:
    ///     `process` must bound its own time.)
    ///   - queueLimit: the most submitted items that wait for a batch at once.
    ///   - rejection: the error a caller gets when its item gave up or was refused.
    ///   - late: receives the result of an item that gave up while its batch was in flight.
    public init(
        maxBatch: Int, gather: Duration = .zero, pace: Duration = .zero, waitLimit: Duration? = nil, queueLimit: Int = .max,
        rejection: @escaping @Sendable (BatchQueueRejection) -> any Error = { $0 },
        late: Late? = nil, process: @escaping Process
    ) {
        precondition(maxBatch > 0 && queueLimit > 0)
        self.maxBatch = maxBatch
        self.gather = gather
        self.pace = pace
        self.waitLimit = waitLimit
        self.queueLimit = queueLimit
        self.rejection = rejection
        self.late = late
        self.overlapsAtAnswer = false
        self.process = { items, _ in await process(items) }
    }

    /// A queue whose `process` gets a one-shot ``BatchRelease`` with each batch.
    ///
    /// - Parameters:
    ///   - overlapsAtAnswer: true: the next batch may start as soon as the current one is
    ///     released (or has returned, whichever comes first), while the current one still waits
    ///     (for the acknowledgement of its commit); at most one batch is ever before its release.
    ///     Its callers are still answered only when `process` returns. Batches may then end out
    ///     of order, so ``flush()`` and ``processedSoFar()`` must not be used on such a queue
    ///     (they trap). False: the release does nothing, as with the other initializer.
    ///   - The others: as for ``init(maxBatch:gather:pace:waitLimit:queueLimit:rejection:late:process:)``
    ///     (no gather, no pace).
    public init(
        maxBatch: Int, waitLimit: Duration? = nil, queueLimit: Int = .max,
        rejection: @escaping @Sendable (BatchQueueRejection) -> any Error = { $0 }, late: Late? = nil,
        overlapsAtAnswer: Bool, process: @escaping ReleasingProcess
    ) {
        precondition(maxBatch > 0 && queueLimit > 0)
        self.maxBatch = maxBatch
        self.gather = .zero
        self.pace = .zero
        self.waitLimit = waitLimit
        self.queueLimit = queueLimit
        self.rejection = rejection
        self.late = late
        self.overlapsAtAnswer = overlapsAtAnswer
        self.process = process
    }

    /// Queues `item` and returns its result once the batch holding it has been processed.
    ///
    /// When nothing is in flight (or, overlapping at the answer, nothing is before its release)
    /// the caller processes its item itself, at once (no hop to another task); what queues
    /// meanwhile is then drained by a new task, from the release on.
    public func submit(_ item: Item) async throws -> Output {
        let leads = state.withLock { state -> Bool in
            if state.running { return false }
            state.running = true
            state.batches += 1
            state.items += 1
            state.largest = max(state.largest, 1)
            return true
        }
        guard leads else { return try await wait(for: item) }
        let release = makeRelease()
        let result = await process([item], release).first ?? .failure(BatchQueueError.missingResult)
        // Released before: the lead was handed over then.
        if release.claim() { handOver() }
        return try result.get()
    }

    /// The release of a batch about to start: it hands the lead over (``handOver()``) when
    /// overlapping at the answer; it does nothing otherwise.
    private func makeRelease() -> BatchRelease {
        guard overlapsAtAnswer else { return BatchRelease(nil) }
        return BatchRelease { self.handOver() }
    }

    /// The batch that led (before its answer) is released or has ended: what queued meanwhile
    /// is drained by a new task, or the queue is idle and the next item's caller leads.
    private func handOver() {
        let (more, waiters) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            if !state.pending.isEmpty { return (true, []) }
            state.running = false
            defer { state.idleWaiters = [] }
            return (false, state.idleWaiters)
        }
        if more { startDrain(gather: .zero) }
        for waiter in waiters { waiter.resume() }
    }

    /// Queues `item` without waiting for it.
    public func enqueue(_ item: Item) {
        append(Entry(item: item))
    }

    /// Queues a submitted item (unless the queue is full) and waits for its result or its wait limit.
    private func wait(for item: Item) async throws -> Output {
        let loop = MultiThreadedEventLoopGroup.currentEventLoop
        return try await withCheckedThrowingContinuation { continuation in
            let deadline = waitLimit.map { NIODeadline.now() + TimeAmount($0) }
            let (id, start, arm) = state.withLock { state -> (UInt64?, Bool, Bool) in
                guard state.waiting < queueLimit else {
                    state.rejected += 1
                    return (nil, false, false)
                }
                state.lastID += 1
                let id = state.lastID
                state.waiters[id] = Waiter(continuation: continuation, loop: loop)
                state.waiting += 1
                var arm = false
                if let deadline {
                    state.deadlines.append((id, deadline))
                    arm = !state.sweepArmed
                    state.sweepArmed = true
                }
                return (id, enqueueLocked(Entry(item: item, id: id), &state), arm)
            }
            guard id != nil else {
                continuation.resume(throwing: rejection(.queueFull))
                return
            }
            if arm, let deadline {
                let timerLoop = loop ?? MultiThreadedEventLoopGroup.singleton.any()
                timerLoop.scheduleTask(deadline: deadline) { self.sweep(on: timerLoop) }
            }
            if start { startDrain(gather: .zero) }
        }
    }

    /// Gives up the items whose wait limit has passed (their callers get
    /// ``BatchQueueRejection/waitedTooLong``), then schedules itself at the next unanswered
    /// item's deadline. One timer per queue instead of one per item: NIO keeps a loop's timers in a
    /// heap and cancels one by a linear search of it, so a timer per call left to fire (5 s of
    /// calls at the default `database.timeout`: ~15,000 at 3,000 calls/s) made every other
    /// timer of the loop (the HTTP server's and the upstream's, several per call) cost more to
    /// schedule and to cancel.
    private func sweep(on loop: any EventLoop) {
        let now = NIODeadline.now()
        let (expired, next) = state.withLock { state -> ([Waiter], NIODeadline?) in
            var expired: [Waiter] = []
            while state.deadlinesHead < state.deadlines.count {
                let (id, at) = state.deadlines[state.deadlinesHead]
                if state.waiters[id] != nil, at > now { break }
                state.deadlinesHead += 1
                guard let waiter = state.waiters.removeValue(forKey: id) else { continue }
                if !waiter.taken { state.waiting -= 1 }
                state.expired += 1
                expired.append(waiter)
            }
            if state.deadlinesHead * 2 >= state.deadlines.count {
                state.deadlines.removeFirst(state.deadlinesHead)
                state.deadlinesHead = 0
            }
            guard state.deadlinesHead < state.deadlines.count else {
                state.sweepArmed = false
                return (expired, nil)
            }
            return (expired, state.deadlines[state.deadlinesHead].at)
        }
        for waiter in expired { waiter.continuation.resume(throwing: rejection(.waitedTooLong)) }
        if let next { loop.scheduleTask(deadline: next) { self.sweep(on: loop) } }
    }

    /// Returns once every item queued before the call has been processed; items queued later do
    /// not hold it up (unlike ``flush()``, which waits for an idle queue). For a read that must
    /// see what was queued before it.
    public func processedSoFar() async {
        precondition(!overlapsAtAnswer, "processedSoFar() on a queue whose batches may end out of order")
        await withCheckedContinuation { continuation in
            let done = state.withLock { state -> Bool in
                if state.processed >= state.queued { return true }
                state.markWaiters.append((state.queued, continuation))
                return false
            }
            if done { continuation.resume() }
        }
    }

    /// Returns when nothing is queued or in flight (for an orderly shutdown).
    public func flush() async {
        precondition(!overlapsAtAnswer, "flush() on a queue whose batches may still run after it is idle")
        await withCheckedContinuation { continuation in
            let idle = state.withLock { state -> Bool in
                if !state.running && state.pending.isEmpty { return true }
                state.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }

    public var statistics: Statistics {
        state.withLock {
            Statistics(
                batches: $0.batches, items: $0.items, largest: $0.largest, expired: $0.expired, rejected: $0.rejected,
                waiting: $0.waiting)
        }
    }

    private func append(_ entry: Entry) {
        let start = state.withLock { enqueueLocked(entry, &$0) }
        if start { startDrain(gather: gather) }
    }

    /// Appends `entry`; returns true when no batch is in flight and the caller must start one.
    private func enqueueLocked(_ entry: Entry, _ state: inout State) -> Bool {
        state.pending.append(entry)
        state.queued += 1
        if state.running { return false }
        state.running = true
        return true
    }

    private func startDrain(gather: Duration) {
        Task {
            if gather > .zero { try? await Task.sleep(for: gather) }
            await self.drain()
        }
    }

    /// Processes batches until the queue is empty (or, overlapping at the answer, until a batch
    /// released the lead to another task before it ended).
    private func drain() async {
        while true {
            let (batch, scanned, idle) = state.withLock { take(&$0) }
            if batch.isEmpty {
                for waiter in state.withLock({ Self.markProcessed(scanned, &$0) }) { waiter.resume() }
                for waiter in idle { waiter.resume() }
                return
            }
            let started = ContinuousClock.now
            let release = makeRelease()
            let results = await process(batch.map(\.item), release)
            deliver(results, of: batch, scanned: scanned)
            // Released before it ended: the lead went to another task then (never without overlap).
            guard release.claim() else { return }
            if pace > .zero, ContinuousClock.now < started + pace {
                try? await Task.sleep(until: started + pace)
            }
        }
    }

    /// Takes the next batch: up to maxBatch items, in arrival order; submitted items whose caller
    /// gave up are dropped (never processed). An empty batch leaves the queue idle, and returns
    /// the ``flush()`` waiters to resume.
    private func take(_ state: inout State) -> ([Entry], Int, [CheckedContinuation<Void, Never>]) {
        var batch: [Entry] = []
        batch.reserveCapacity(min(state.pending.count, maxBatch))
        var scanned = 0
        for entry in state.pending {
            if batch.count == maxBatch { break }
            scanned += 1
            if entry.id != 0 {
                guard state.waiters[entry.id] != nil else { continue }
                state.waiters[entry.id]?.taken = true
                state.waiting -= 1
            }
            batch.append(entry)
        }
        state.pending.removeFirst(scanned)
        if batch.isEmpty {
            // Nothing left (a batch stops short of maxBatch only at the queue's end).
            state.running = false
            defer { state.idleWaiters = [] }
            return ([], scanned, state.idleWaiters)
        }
        state.batches += 1
        state.items += batch.count
        state.largest = max(state.largest, batch.count)
        return (batch, scanned, [])
    }

    /// Hands each submitted item of `batch` its result: to its caller, on the caller's loop, or
    /// to `late` when the caller gave up while the batch was in flight.
    private func deliver(_ results: [Result<Output, any Error>], of batch: [Entry], scanned: Int) {
        let (reached, answered) = state.withLock { state -> ([CheckedContinuation<Void, Never>], [Waiter?]) in
            let answered = batch.map { entry in entry.id == 0 ? nil : state.waiters.removeValue(forKey: entry.id) }
            return (Self.markProcessed(scanned, &state), answered)
        }
        for waiter in reached { waiter.resume() }
        for (index, entry) in batch.enumerated() where entry.id != 0 {
            let result = index < results.count ? results[index] : .failure(BatchQueueError.missingResult)
            guard let waiter = answered[index] else {
                late?(entry.item, result)
                continue
            }
            if let loop = waiter.loop, !loop.inEventLoop {
                loop.execute { waiter.continuation.resume(with: result) }
            } else {
                waiter.continuation.resume(with: result)
            }
        }
    }

    /// Counts `count` more items as processed; returns the ``processedSoFar()`` waiters that reached their mark.
    private static func markProcessed(_ count: Int, _ state: inout State) -> [CheckedContinuation<Void, Never>] {
        state.processed += count
        guard !state.markWaiters.isEmpty else { return [] }
        let processed = state.processed
        let reached = state.markWaiters.filter { $0.mark <= processed }.map(\.continuation)
        state.markWaiters.removeAll { $0.mark <= processed }
        return reached
    }
}
