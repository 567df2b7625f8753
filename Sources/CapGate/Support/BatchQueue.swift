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
/// order. At most one batch is in flight per queue.
public final class BatchQueue<Item: Sendable, Output: Sendable>: Sendable {
    public typealias Process = @Sendable ([Item]) async -> [Result<Output, any Error>]

    private struct Entry: Sendable {
        let item: Item
        /// nil for fire-and-forget items (``enqueue(_:)``).
        let continuation: CheckedContinuation<Output, any Error>?
        /// The event loop the submitter ran on: its result is handed over there, so the caller
        /// continues on its own loop (with its own connections) instead of every caller of a
        /// batch continuing on the loop that ran the batch.
        var loop: (any EventLoop)? = nil
    }

    private struct State: Sendable {
        var pending: [Entry] = []
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
    }

    /// Counts since start, for metrics and tests.
    public struct Statistics: Sendable {
        public var batches: Int
        public var items: Int
        public var largest: Int
    }

    private let state = Mutex(State())
    private let maxBatch: Int
    private let gather: Duration
    private let process: Process

    /// - Parameter gather: for fire-and-forget items (``enqueue(_:)``) only: how long an item
    ///   arriving at an idle queue waits for company before its batch starts. Nobody waits on
    ///   such items, so a short wait turns many small transactions into one. Items submitted
    ///   with ``submit(_:)`` never wait for it.
    public init(maxBatch: Int, gather: Duration = .zero, process: @escaping Process) {
        precondition(maxBatch > 0)
        self.maxBatch = maxBatch
        self.gather = gather
        self.process = process
    }

    /// Queues `item` and returns its result once the batch holding it has been processed.
    ///
    /// When nothing is in flight the caller processes its item itself, at once (no hop to another
    /// task); what queues meanwhile is then drained by a new task.
    public func submit(_ item: Item) async throws -> Output {
        let leads = state.withLock { state -> Bool in
            if state.running { return false }
            state.running = true
            state.batches += 1
            state.items += 1
            state.largest = max(state.largest, 1)
            return true
        }
        guard leads else {
            let loop = MultiThreadedEventLoopGroup.currentEventLoop
            return try await withCheckedThrowingContinuation { continuation in
                append(Entry(item: item, continuation: continuation, loop: loop))
            }
        }
        let result = await process([item]).first ?? .failure(BatchQueueError.missingResult)
        let (more, waiters) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            if !state.pending.isEmpty { return (true, []) }
            state.running = false
            defer { state.idleWaiters = [] }
            return (false, state.idleWaiters)
        }
        if more {
            Task { await self.drain() }
        }
        for waiter in waiters { waiter.resume() }
        return try result.get()
    }

    /// Queues `item` without waiting for it.
    public func enqueue(_ item: Item) {
        append(Entry(item: item, continuation: nil))
    }

    /// Returns once every item queued before the call has been processed; items queued later do
    /// not hold it up (unlike ``flush()``, which waits for an idle queue). For a read that must
    /// see what was queued before it.
    public func processedSoFar() async {
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
        state.withLock { Statistics(batches: $0.batches, items: $0.items, largest: $0.largest) }
    }

    private func append(_ entry: Entry) {
        let start = state.withLock { state -> Bool in
            state.pending.append(entry)
            state.queued += 1
            if state.running { return false }
            state.running = true
            return true
        }
        if start {
            let gather = entry.continuation == nil ? self.gather : .zero
            Task {
                if gather > .zero { try? await Task.sleep(for: gather) }
                await self.drain()
            }
        }
    }

    /// Processes batches until the queue is empty.
    private func drain() async {
        while true {
            let (batch, waiters) = state.withLock { state -> ([Entry], [CheckedContinuation<Void, Never>]) in
                if state.pending.isEmpty {
                    state.running = false
                    defer { state.idleWaiters = [] }
                    return ([], state.idleWaiters)
                }
                let count = min(state.pending.count, maxBatch)
                let batch = Array(state.pending.prefix(count))
                state.pending.removeFirst(count)
                state.batches += 1
                state.items += count
                state.largest = max(state.largest, count)
                return (batch, [])
            }
            if batch.isEmpty {
                for waiter in waiters { waiter.resume() }
                return
            }
            let results = await process(batch.map(\.item))
            let reached = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.processed += batch.count
                guard !state.markWaiters.isEmpty else { return [] }
                let processed = state.processed
                let reached = state.markWaiters.filter { $0.mark <= processed }.map(\.continuation)
                state.markWaiters.removeAll { $0.mark <= processed }
                return reached
            }
            for waiter in reached { waiter.resume() }
            for (index, entry) in batch.enumerated() {
                guard let continuation = entry.continuation else { continue }
                let result = index < results.count ? results[index] : .failure(BatchQueueError.missingResult)
                if let loop = entry.loop, !loop.inEventLoop {
                    loop.execute { continuation.resume(with: result) }
                } else {
                    continuation.resume(with: result)
                }
            }
        }
    }
}

/// `process` returned fewer results than items (a bug in the processor).
public struct BatchQueueError: Error {
    public static let missingResult = BatchQueueError()
}
