import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// The PostgreSQL pool plus the rules for talking to it: every call is bounded by
/// `database.timeout`, and connection failures become ``DatabaseError/unavailable`` so the HTTP
/// edge answers 503 (fail closed) instead of forwarding an unrecorded call.
public struct Database: Sendable {
    public let client: PostgresClient
    public let timeout: Duration
    public let logger: Logger

    public init(client: PostgresClient, timeout: Duration, logger: Logger) {
        self.client = client
        self.timeout = timeout
        self.logger = logger
    }

    /// Runs `body` with the pool, mapping failures to domain errors.
    ///
    /// - Parameter abandonAtDeadline: answer at the deadline even if `body` has not ended (it
    ///   goes on in the background). Only for writes nobody waits on and that may land late
    ///   (token counts): a PostgresNIO call in progress does not react to cancellation, and one
    ///   stuck on a connection that died would otherwise hold its caller forever. Admissions and
    ///   refunds keep waiting, so a late commit is never answered as a failure.
    public func run<T: Sendable>(
        abandonAtDeadline: Bool = false, _ body: @escaping @Sendable (PostgresClient) async throws -> T
    ) async throws -> T {
        do {
            if abandonAtDeadline {
                return try await withDeadlineAbandoning(timeout) { try await body(client) }
            }
            return try await withDeadline(timeout) { try await body(client) }
        } catch let error as PSQLError {
            throw DatabaseError.map(error, logger: logger)
        } catch let error as PostgresTransactionError {
            throw DatabaseError.map(error.closureError ?? error.commitError ?? error.beginError ?? error, logger: logger)
        } catch is DeadlineExceeded, is CancellationError, is ChannelError, is IOError {
            throw DatabaseError.unavailable
        } catch {
            // Domain errors thrown by the body pass through unchanged.
            throw error
        }
    }

    /// Runs `body` in one transaction.
    public func transaction<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        try await run { client in
            do {
                return try await client.withTransaction(logger: logger) { try await body($0) }
            } catch let error as PostgresTransactionError {
                if let inner = error.closureError { throw inner }
                throw error
            }
        }
    }
}

/// Database failures as the rest of CapGate sees them.
public enum DatabaseError: Error, Sendable {
    /// The database could not be reached (or did not answer in time).
    case unavailable
    /// A constraint was violated: the SQLSTATE and the constraint name.
    case constraint(sqlState: String, constraint: String?, detail: String?)
    /// Anything else (a bug, not the caller's fault).
    case other(String)

    static func map(_ error: any Error, logger: Logger) -> DatabaseError {
        if let error = error as? DatabaseError { return error }
        if let psql = error as? PSQLError {
            if let state = psql.serverInfo?[.sqlState] {
                if state.hasPrefix("23") {
                    return .constraint(sqlState: state, constraint: psql.serverInfo?[.constraintName], detail: psql.serverInfo?[.detail])
                }
                if state.hasPrefix("08") || state.hasPrefix("57P") || state == "53300" {
                    return .unavailable
                }
                logger.error("database error", metadata: ["error": "\(String(reflecting: psql))"])
                return .other(state)
            }
            switch psql.code {
            case .serverClosedConnection, .connectionError, .uncleanShutdown, .clientClosedConnection,
                .poolClosed, .queryCancelled:
                return .unavailable
            default:
                logger.error("database error", metadata: ["error": "\(String(reflecting: psql))"])
                return .unavailable
            }
        }
        if error is CancellationError { return .unavailable }
        if error is DeadlineExceeded { return .unavailable }
        if error is ChannelError || error is IOError { return .unavailable }
        logger.error("database error", metadata: ["error": "\(String(reflecting: error))"])
        return .unavailable
    }
}

/// Thrown by ``withDeadline(_:_:)`` when the time ran out.
public struct DeadlineExceeded: Error {}

/// Runs `body`, cancelling it and throwing ``DeadlineExceeded`` if it takes longer than `limit`.
///
/// The deadline is a timer on the calling task's event loop (Swift Concurrency runs on the NIO
/// event loops), not a sleeping task: arming and disarming it costs no system call and wakes no
/// other thread, which a `Task.sleep` (Dispatch's timer thread) did twice per database call.
/// Like a task group, it waits for `body` to end after cancelling it.
public func withDeadline<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let task = Task { try await body() }
    let expired = DeadlineFlag()
    let timer = scheduleDeadline(limit) {
        expired.set()
        task.cancel()
    }
    defer { timer.cancel() }
    do {
        return try await withTaskCancellationHandler {
            try await task.value
        } onCancel: {
            task.cancel()
        }
    } catch  where expired.isSet {
        throw DeadlineExceeded()
    }
}

/// Runs `body` and returns its result, or throws ``DeadlineExceeded`` at `limit` without waiting
/// for `body` to end: it is cancelled and left to finish in the background. For work whose late
/// completion is harmless and which nobody should wait on forever (see ``Database/run(abandonAtDeadline:_:)``).
public func withDeadlineAbandoning<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    let task = Task { try await body() }
    return try await withCheckedThrowingContinuation { continuation in
        let answer = AnswerOnce(continuation)
        let timer = scheduleDeadline(limit) {
            task.cancel()
            answer.resume(with: .failure(DeadlineExceeded()))
        }
        Task {
            let result = await task.result
            timer.cancel()
            answer.resume(with: result)
        }
    }
}

/// Arms `fire` after `limit` on the calling task's event loop (or any loop of the shared group).
private func scheduleDeadline(_ limit: Duration, _ fire: @escaping @Sendable () -> Void) -> Scheduled<Void> {
    let loop = MultiThreadedEventLoopGroup.currentEventLoop ?? MultiThreadedEventLoopGroup.singleton.any()
    let (seconds, attoseconds) = limit.components
    return loop.scheduleTask(in: .nanoseconds(seconds * 1_000_000_000 + attoseconds / 1_000_000_000), fire)
}

/// Resumes a continuation with whichever result comes first.
final class AnswerOnce<T: Sendable>: Sendable {
    private let continuation: Mutex<CheckedContinuation<T, any Error>?>

    init(_ continuation: CheckedContinuation<T, any Error>) {
        self.continuation = Mutex(continuation)
    }

    func resume(with result: Result<T, any Error>) {
        let first = continuation.withLock { stored -> CheckedContinuation<T, any Error>? in
            defer { stored = nil }
            return stored
        }
        first?.resume(with: result)
    }
}

/// Set once by ``withDeadline(_:_:)``'s timer.
final class DeadlineFlag: Sendable {
    private let value = Atomic(false)
    func set() { value.store(true, ordering: .relaxed) }
    var isSet: Bool { value.load(ordering: .relaxed) }
}

extension AsyncSequence {
    /// Every element, in order (for small, bounded results).
    public func collect() async throws -> [Element] {
        var out: [Element] = []
        for try await element in self { out.append(element) }
        return out
    }
}
