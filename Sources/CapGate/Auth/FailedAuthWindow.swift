/// The failed operator and metrics authentications of the current second, per client address
/// (SPEC §7): past `limit` from one address in one second, each further failure is refused
/// until the next second begins. A value with no clock of its own: the caller says when.
///
/// Only failures are counted; a success never reaches it. A count is worth nothing once its
/// second has passed, so the table is emptied when a failure arrives in a new second, and it
/// never holds more than `capacity` addresses: when an attacker sprays more addresses than that
/// within one second, the further ones share one count (and so are throttled together),
/// rather than growing the table or letting them go uncounted.
struct FailedAuthWindow: Sendable {
    enum Verdict: Equatable, Sendable {
        /// Within the limit: answer the failure as it is (401).
        case allowed
        /// Past the limit: answer 429 with this `Retry-After` (whole seconds).
        case throttled(retryAfter: Int)
    }

    /// SPEC §7: 10 failures in a second pass, the 11th is refused.
    static let defaultLimit = 10
    /// The addresses counted separately within one second (about 100 KiB at most).
    static let defaultCapacity = 4096

    let limit: Int
    let capacity: Int
    /// The whole second (since the clock's origin) that `counts` are for.
    private(set) var second: Int64 = .min
    private(set) var counts: [ClientAddress: Int] = [:]
    /// This second's failures from addresses that found the table full.
    private(set) var overflow = 0

    init(limit: Int = Self.defaultLimit, capacity: Int = Self.defaultCapacity) {
        self.limit = limit
        self.capacity = capacity
    }

    /// The addresses counted this second.
    var tracked: Int { counts.count }

    /// Counts one failed authentication from `address` at `now` (time since any fixed origin).
    mutating func failure(from address: ClientAddress, at now: Duration) -> Verdict {
        let second = now.components.seconds
        if second != self.second {
            self.second = second
            counts.removeAll(keepingCapacity: true)
            overflow = 0
        }
        let count: Int
        if let previous = counts[address] {
            count = previous + 1
            counts[address] = count
        } else if counts.count < capacity {
            count = 1
            counts[address] = count
        } else {
            overflow += 1
            count = overflow
        }
        // The window ends within the second, so one second always covers the wait.
        return count > limit ? .throttled(retryAfter: 1) : .allowed
    }
}
