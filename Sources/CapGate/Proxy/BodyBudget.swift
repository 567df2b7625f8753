import Synchronization

/// The bytes of request bodies being read at once, all calls together, and their bound
/// (`proxy.bodyBudgetBytes`): many large or slow uploads cannot together exhaust memory. A call
/// reserves the bytes it has received, chunk by chunk as they arrive (never a declared length a
/// slow client could hold without sending), and releases them when the read ends; a reservation
/// that does not fit is refused and the call answered 503 (`overloaded_error`), before anything is
/// charged or forwarded.
public final class BodyBudget: Sendable {
    /// `proxy.bodyBudgetBytes`.
    public let limit: Int
    private let reserved = Atomic<Int>(0)

    public init(limit: Int) {
        precondition(limit > 0)
        self.limit = limit
    }

    /// Reserves `bytes` if they fit under the limit with everything reserved so far.
    public func reserve(_ bytes: Int) -> Bool {
        guard bytes > 0 else { return true }
        var current = reserved.load(ordering: .relaxed)
        while true {
            guard bytes <= limit - current else { return false }
            let (exchanged, original) = reserved.compareExchange(
                expected: current, desired: current + bytes, ordering: .relaxed)
            if exchanged { return true }
            current = original
        }
    }

    /// Gives back `bytes` reserved earlier.
    public func release(_ bytes: Int) {
        guard bytes > 0 else { return }
        reserved.subtract(bytes, ordering: .relaxed)
    }

    /// The bytes reserved now (for tests and metrics).
    public var inUse: Int { reserved.load(ordering: .relaxed) }
}
