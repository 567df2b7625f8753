import Foundation

extension ChildProcess {
    /// What the waiting thread found, and who waits for it (under the child's lock).
    struct State: Sendable {
        /// The child was reaped: its process id is no longer its own.
        var reaped = false
        /// Its exit status, set (with what it printed) once it ended and was reaped.
        var status: Int32?
        var output: [UInt8] = []
        var errors: [UInt8] = []
        var waiters: [Int: Waiter] = [:]
        /// Waiters whose task was cancelled before they were kept.
        var cancelled: Set<Int> = []
        var lastWaiter = 0

        /// A new waiter's number.
        mutating func newWaiter() -> Int {
            lastWaiter += 1
            return lastWaiter
        }

        /// Keeps `waiter` as number `id` until the child ends; false when it is to be resumed
        /// now instead: the child has ended, or the task waiting was cancelled already.
        mutating func keep(_ waiter: Waiter, id: Int) -> Bool {
            guard status == nil, cancelled.remove(id) == nil else { return false }
            waiters[id] = waiter
            return true
        }

        /// Takes away waiter `id` (to be resumed without a status); one not kept yet is noted, so
        /// that it is not kept when it comes.
        mutating func cancel(_ id: Int) -> Waiter? {
            if let waiter = waiters.removeValue(forKey: id) { return waiter }
            if status == nil { cancelled.insert(id) }
            return nil
        }
    }

    /// A task or a thread waiting for the child's end.
    enum Waiter: Sendable {
        case task(CheckedContinuation<Int32?, Never>)
        case thread(DispatchSemaphore)

        /// Wakes it: `status`, or nil when its task was cancelled.
        func resume(_ status: Int32?) {
            switch self {
            case .task(let continuation): continuation.resume(returning: status)
            case .thread(let semaphore): semaphore.signal()
            }
        }
    }
}
