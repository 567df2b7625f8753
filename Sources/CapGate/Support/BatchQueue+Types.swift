import Synchronization

extension BatchQueue {
    /// What processes a batch: one result per item, in order.
    public typealias Process = @Sendable ([Item]) async -> [Result<Output, any Error>]
    /// A `process` that may call its ``BatchRelease`` to let the next batch start before it returns.
    public typealias ReleasingProcess = @Sendable ([Item], BatchRelease) async -> [Result<Output, any Error>]
    /// Receives the result of an item whose caller had given up (``BatchQueueRejection/waitedTooLong``)
    /// while its batch was in flight.
    public typealias Late = @Sendable (Item, Result<Output, any Error>) -> Void

    /// Counts since start, for metrics and tests.
    public struct Statistics: Sendable {
        public var batches: Int
        public var items: Int
        public var largest: Int
        /// Submitted items that gave up at the wait limit.
        public var expired: Int
        /// Submitted items refused because the queue was full.
        public var rejected: Int
        /// Submitted items waiting for a batch now.
        public var waiting: Int
    }
}

/// Given to each batch's `process` by a ``BatchQueue``: calling it says the batch no longer holds
/// up the next one (an admission: its statement answered, and only the acknowledgement of its
/// commit is awaited). Only the first call, or the batch's end if it comes first, counts.
public final class BatchRelease: Sendable {
    private let claimed = Atomic(false)
    /// nil: a queue that does not overlap; the release does nothing (the batch's end still claims).
    private let handOver: (@Sendable () -> Void)?

    init(_ handOver: (@Sendable () -> Void)?) {
        self.handOver = handOver
    }

    /// Lets the queue start its next batch (once; later calls do nothing).
    public func callAsFunction() {
        if let handOver, claim() { handOver() }
    }

    /// True for the first of the release and the batch's end.
    func claim() -> Bool {
        claimed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }
}

/// `process` returned fewer results than items (a bug in the processor).
public struct BatchQueueError: Error {
    public static let missingResult = BatchQueueError()
}

/// Why ``BatchQueue/submit(_:)`` refused an item without processing it.
public enum BatchQueueRejection: Error, Sendable {
    /// The item waited the queue's wait limit since it arrived.
    case waitedTooLong
    /// As many items as the queue's limit were already waiting.
    case queueFull
}
