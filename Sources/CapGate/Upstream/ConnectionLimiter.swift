import NIOCore
import Synchronization

/// The cap on connections to the provider (`upstream.maxConnections`), shared by every event
/// loop's pool. A connection holds a ``ConnectionSlot`` from the moment it is dialled until it
/// closes; a call that finds no idle connection and no free slot waits, first come first served,
/// until a slot is freed (it is handed over, never counted twice) or its deadline passes.
final class ConnectionLimiter: Sendable {
    /// What a call gets: a slot to dial with now, or its place in the queue.
    enum Acquired {
        case slot(ConnectionSlot)
        case queued(id: Int)
    }

    private struct Waiter {
        var id: Int
        var grant: @Sendable (ConnectionSlot) -> Void
    }

    private struct State {
        var open = 0
        var nextID = 0
        var waiters: [Waiter] = []
        var head = 0

        var waiting: Int { waiters.count - head }

        mutating func popFirst() -> Waiter? {
            guard head < waiters.count else { return nil }
            let first = waiters[head]
            head += 1
            if head > 64, head * 2 > waiters.count {
                waiters.removeFirst(head)
                head = 0
            }
            return first
        }
    }

    let maxConnections: Int
    private let state = Mutex(State())

    init(maxConnections: Int) {
        self.maxConnections = maxConnections
    }

    /// A slot now, or else `grant` is called later (on any thread) with one, unless ``cancel(_:)``
    /// took the call out of the queue first.
    func acquire(orWait grant: @escaping @Sendable (ConnectionSlot) -> Void) -> Acquired {
        let queued: Int? = state.withLock { state in
            if state.open < maxConnections, state.waiting == 0 {
                state.open += 1
                return nil
            }
            state.nextID += 1
            state.waiters.append(Waiter(id: state.nextID, grant: grant))
            return state.nextID
        }
        if let queued { return .queued(id: queued) }
        return .slot(ConnectionSlot(limiter: self))
    }

    /// Takes a waiting call out of the queue; false when it was granted a slot already.
    func cancel(_ id: Int) -> Bool {
        state.withLock { state in
            guard let index = state.waiters[state.head...].firstIndex(where: { $0.id == id }) else { return false }
            state.waiters.remove(at: index)
            return true
        }
    }

    /// Calls are waiting for a slot: a connection that falls idle is closed for them.
    var hasWaiters: Bool { state.withLock { $0.waiting > 0 } }

    /// Connections open or being opened.
    var openConnections: Int { state.withLock { $0.open } }

    /// A connection closed: its slot goes to the first waiting call, or back to the cap.
    fileprivate func release() {
        let next: Waiter? = state.withLock { state in
            if let first = state.popFirst() { return first }
            state.open -= 1
            return nil
        }
        next?.grant(ConnectionSlot(limiter: self))
    }
}

/// One connection's place under the cap, given back exactly once.
final class ConnectionSlot: Sendable {
    private let limiter: ConnectionLimiter
    private let released = Atomic(false)

    fileprivate init(limiter: ConnectionLimiter) {
        self.limiter = limiter
    }

    func release() {
        if !released.exchange(true, ordering: .acquiringAndReleasing) { limiter.release() }
    }
}
