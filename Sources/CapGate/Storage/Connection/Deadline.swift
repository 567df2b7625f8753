import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// Thrown by ``withDeadline(_:lateResult:_:)`` when the time ran out.
public struct DeadlineExceeded: Error {}

/// Runs `body` and returns its result, or throws ``DeadlineExceeded`` at `limit` without waiting
/// for `body` to end: it is then cancelled and left to finish in the background, and
/// `lateResult` (if any) receives its outcome when it ends.
///
/// The deadline is a timer on the calling task's event loop (Swift Concurrency runs on the NIO
/// event loops), not a sleeping task: arming and disarming it costs no system call and wakes no
/// other thread, which a `Task.sleep` (Dispatch's timer thread) did twice per database call.
///
/// `cancelsAtDeadline` (default: always) decides whether `body` is cancelled when the caller is
/// answered without it, at the deadline or on the caller's cancellation.
public func withDeadline<T: Sendable>(
    _ limit: Duration, lateResult: (@Sendable (Result<T, any Error>) -> Void)? = nil,
    cancelsAtDeadline: (@Sendable () -> Bool)? = nil,
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let race = DeadlineRace<T>()
    let work = Task {
        let result: Result<T, any Error>
        do { result = .success(try await body()) } catch { result = .failure(error) }
        if !race.answer(result) { lateResult?(result) }
    }
    let timer = scheduleDeadline(limit) {
        // Answer first: cancelling can make `body` fail at once (a pool's lease wait ends with
        // its own error), and the caller must see the deadline.
        race.answer(.failure(DeadlineExceeded()))
        if cancelsAtDeadline?() ?? true { work.cancel() }
    }
    defer { timer.cancel() }
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { race.install($0) }
    } onCancel: {
        if cancelsAtDeadline?() ?? true { work.cancel() }
    }
}

/// Arms `fire` after `limit` on the calling task's event loop (or any loop of the shared group).
private func scheduleDeadline(_ limit: Duration, _ fire: @escaping @Sendable () -> Void) -> Scheduled<Void> {
    let loop = MultiThreadedEventLoopGroup.currentEventLoop ?? MultiThreadedEventLoopGroup.singleton.any()
    let (seconds, attoseconds) = limit.components
    return loop.scheduleTask(in: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000), fire)
}

/// Whichever of ``withDeadline(_:lateResult:_:)``'s body and timer answers first resumes the
/// caller; the result may arrive before the caller's continuation is installed.
final class DeadlineRace<T: Sendable>: Sendable {
    private enum State {
        case waiting
        case installed(CheckedContinuation<T, any Error>)
        case early(Result<T, any Error>)
        case answered
    }

    private let state = Mutex(State.waiting)

    func install(_ continuation: CheckedContinuation<T, any Error>) {
        let early = state.withLock { state -> Result<T, any Error>? in
            guard case .early(let result) = state else {
                state = .installed(continuation)
                return nil
            }
            state = .answered
            return result
        }
        if let early { continuation.resume(with: early) }
    }

    /// Returns false when the caller had already been answered (`result` came too late).
    @discardableResult
    func answer(_ result: Result<T, any Error>) -> Bool {
        let (first, continuation) = state.withLock { state -> (Bool, CheckedContinuation<T, any Error>?) in
            switch state {
            case .waiting:
                state = .early(result)
                return (true, nil)
            case .installed(let continuation):
                state = .answered
                return (true, continuation)
            case .early, .answered:
                return (false, nil)
            }
        }
        continuation?.resume(with: result)
        return first
    }
}

/// Where one ``Database/write(lateResult:failed:_:)`` is, so that its `failed` hears of it once:
/// waiting for a connection (nothing sent), on one (its statements may be running), ended, or
/// abandoned at the deadline while still waiting.
final class WriteProgress: Sendable {
    enum Stage: Int { case waiting = 0, onConnection = 1, ended = 2, abandoned = 3 }
    private let stage = Atomic(Stage.waiting.rawValue)
    private let closed = Mutex<EventLoopFuture<Void>?>(nil)

    /// The write is on a connection that `closed` completes when it closes; false when the
    /// deadline abandoned the write first.
    func leased(closed: EventLoopFuture<Void>) -> Bool {
        self.closed.withLock { $0 = closed }
        return stage.compareExchange(
            expected: Stage.waiting.rawValue, desired: Stage.onConnection.rawValue, ordering: .acquiringAndReleasing
        )
        .exchanged
    }

    /// Ends the write if it is at `from`; false when it was elsewhere (already ended).
    func end(from: Stage) -> Bool {
        stage.compareExchange(expected: from.rawValue, desired: Stage.ended.rawValue, ordering: .acquiringAndReleasing).exchanged
    }

    /// At the deadline: true (cancel the write) when it was still waiting for a connection, which
    /// it now gives up. On a connection it is left to end; `failed` hears of an unknown outcome
    /// if the connection closes first (a statement on a closed connection never answers), or if
    /// the write has still not ended `backstop` later (a host gone without a word keeps its TCP
    /// connection open for many minutes; the give-back then searches the ledger, and a commit
    /// that comes even later still reaches `lateResult`).
    func deadline(failed: (@Sendable (any Error) -> Void)?, backstop: Duration) -> Bool {
        let (abandoned, seen) = stage.compareExchange(
            expected: Stage.waiting.rawValue, desired: Stage.abandoned.rawValue, ordering: .acquiringAndReleasing)
        if abandoned { return true }
        guard seen == Stage.onConnection.rawValue, let closed = closed.withLock({ $0 }) else { return false }
        closed.whenComplete { _ in
            if self.end(from: .onConnection) { failed?(CommitUnacknowledged(reason: ConnectionLost())) }
        }
        closed.eventLoop.scheduleTask(in: TimeAmount(backstop)) {
            if self.end(from: .onConnection) { failed?(CommitUnacknowledged(reason: DeadlineExceeded())) }
        }
        return false
    }
}
