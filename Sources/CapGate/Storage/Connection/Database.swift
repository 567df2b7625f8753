import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// The PostgreSQL pool plus the rules for talking to it: every call is bounded by
/// `database.timeout`, and connection failures become ``DatabaseError/unavailable`` so the HTTP
/// edge answers 503 (fail closed) instead of forwarding an unrecorded call.
///
/// A multi-host `database.url` is served by a ``PrimaryFollower``: calls go to its current
/// client, and a call that fails as unavailable tells it to look for the writable host.
public struct Database: Sendable {
    /// Where calls get their client: one fixed pool (a single-host URL, the one-shot commands),
    /// or the pool of whichever host accepts writes now.
    enum Source: Sendable {
        case fixed(PostgresClient)
        case following(PrimaryFollower)

        var client: PostgresClient {
            switch self {
            case .fixed(let client): client
            case .following(let follower): follower.client
            }
        }

        func callFailed() {
            if case .following(let follower) = self { follower.callFailed() }
        }

        /// True when `client` is no longer the one calls use (a failover replaced it).
        func replaced(_ client: PostgresClient) -> Bool {
            guard case .following(let follower) = self else { return false }
            return follower.client !== client
        }
    }

    let source: Source
    public let timeout: Duration
    public let logger: Logger

    /// The client calls use now.
    public var client: PostgresClient { source.client }

    public init(client: PostgresClient, timeout: Duration, logger: Logger) {
        self.source = .fixed(client)
        self.timeout = timeout
        self.logger = logger
    }

    /// A database that follows `follower` from host to host.
    public init(follower: PrimaryFollower, timeout: Duration, logger: Logger) {
        self.source = .following(follower)
        self.timeout = timeout
        self.logger = logger
    }

    private init(source: Source, timeout: Duration, logger: Logger) {
        self.source = source
        self.timeout = timeout
        self.logger = logger
    }

    /// The same pool (or followed host) with another bound on each call: a long job beside the
    /// gateway's short calls (retention's drop reads a whole month of the ledger).
    func with(timeout: Duration) -> Database {
        Database(source: source, timeout: timeout, logger: logger)
    }

    /// Runs `body` with the pool, mapping failures to domain errors.
    ///
    /// The caller is answered by `database.timeout` at the latest, with ``DatabaseError/unavailable``
    /// (503, fail closed) if `body` has not ended by then. `body` is cancelled, but a PostgresNIO
    /// call in progress does not react to cancellation, and a PostgreSQL that stops answering (a
    /// stalled server, a network partition) would otherwise hold every caller forever; so `body`
    /// is left to finish in the background, and a write in it may still commit after its caller
    /// was told it failed. Where that matters (an admission: a charge for a call that was never
    /// forwarded) the caller passes `lateResult`, which receives `body`'s outcome when it ends
    /// after the caller was answered.
    @discardableResult
    public func run<T: Sendable>(
        lateResult: (@Sendable (Result<T, any Error>) -> Void)? = nil,
        _ body: @escaping @Sendable (PostgresClient) async throws -> T
    ) async throws -> T {
        try await run(lateResult: lateResult, cancelsAtDeadline: nil, body)
    }

    /// ``run(lateResult:_:)`` where `cancelsAtDeadline` decides, when the caller is answered,
    /// whether `body` is cancelled (true) or left to end by itself (false).
    func run<T: Sendable>(
        lateResult: (@Sendable (Result<T, any Error>) -> Void)?, cancelsAtDeadline: (@Sendable () -> Bool)?,
        _ body: @escaping @Sendable (PostgresClient) async throws -> T
    ) async throws -> T {
        let source = self.source
        let client = source.client
        do {
            return try await withDeadline(timeout, lateResult: lateResult, cancelsAtDeadline: cancelsAtDeadline) {
                GatewayMetrics.databaseOperation(1)
                defer { GatewayMetrics.databaseOperation(-1) }
                return try await body(client)
            }
        } catch let error as PSQLError {
            let mapped = DatabaseError.map(error, logger: logger)
            if case .unavailable = mapped {
                GatewayMetrics.databaseUnavailableOnce()
                source.callFailed()
            }
            throw mapped
        } catch let error as PostgresTransactionError {
            let mapped = DatabaseError.map(error.closureError ?? error.commitError ?? error.beginError ?? error, logger: logger)
            if case .unavailable = mapped { source.callFailed() }
            throw mapped
        } catch is DeadlineExceeded, is CancellationError, is ChannelError, is IOError, is CommitUnacknowledged, is ConnectionLost {
            GatewayMetrics.databaseUnavailableOnce()
            source.callFailed()
            throw DatabaseError.unavailable
        } catch {
            // A pool that a failover closed fails its calls with its own error type.
            if source.replaced(client) && !(error is DatabaseError) {
                GatewayMetrics.databaseUnavailableOnce()
                throw DatabaseError.unavailable
            }
            // Domain errors thrown by the body pass through unchanged.
            throw error
        }
    }

    /// Runs `body` on one pooled connection, as ``run(lateResult:_:)`` does, and returns only once
    /// PostgreSQL has acknowledged the commit of what it ran (``CommitWitness``): every write
    /// CapGate acts on goes through here (or ``transaction(_:)``), so nothing is acted on that a
    /// primary stopped during its synchronous wait may lose. A write answered but not
    /// acknowledged fails as ``DatabaseError/unavailable``; `failed` receives the error as the
    /// connection gave it (``CommitUnacknowledged`` when the outcome is unknown) before it is
    /// mapped, for a caller that must give back what the write may have done.
    ///
    /// Reads use ``run(lateResult:_:)``: a read acted on before its transaction ends reads what
    /// was committed, and costs no extra round trip.
    @discardableResult
    public func write<T: Sendable>(
        lateResult: (@Sendable (Result<T, any Error>) -> Void)? = nil,
        failed: (@Sendable (any Error) -> Void)? = nil,
        _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let logger = self.logger
        return try await write(lateResult: lateResult, failed: failed, commit: { try await $0.committed(logger: logger, body) })
    }

    /// ``write(lateResult:failed:_:)`` of one prepared statement: its rows, once its commit is
    /// acknowledged (``PostgresConnection/committedRows(_:logger:answered:)``, the proof statement
    /// queued behind it). `answered` is called when the rows have come and only the
    /// acknowledgement is awaited (its row locks are released by the commit before it): the
    /// admission queue starts its next batch then.
    public func write<Statement: PostgresPreparedStatement>(
        statement: Statement, lateResult: (@Sendable (Result<[Statement.Row], any Error>) -> Void)? = nil,
        failed: (@Sendable (any Error) -> Void)? = nil, answered: (@Sendable () -> Void)? = nil
    ) async throws -> [Statement.Row] where Statement.Row: Sendable {
        let logger = self.logger
        return try await write(
            lateResult: lateResult, failed: failed,
            commit: { try await $0.committedRows(statement, logger: logger, answered: answered) })
    }

    /// ``write(lateResult:failed:_:)`` with the acknowledged commit made by `commit` (which calls
    /// ``PostgresConnection/committed(logger:_:)`` or ``PostgresConnection/committedRows(_:logger:)``).
    ///
    /// At the deadline a write still waiting for a connection is cancelled (nothing was sent). A
    /// write on a connection is not: cancelling it would stop PostgresNIO reading its rows and
    /// turn a commit into an unknown outcome, whose give-back would rest on searching the ledger
    /// at a moment the late transaction may not have committed yet (a stalled server resumed).
    /// It is left to end, and its end says what happened: `lateResult` hears of a commit,
    /// `failed` of an unknown outcome. A statement written to a connection that had just closed
    /// never answers, so `failed` also hears when the connection closes under it, or when the
    /// write has not ended 3 × `database.timeout` (at least 30 s) after its deadline.
    func write<T: Sendable>(
        lateResult: (@Sendable (Result<T, any Error>) -> Void)?, failed: (@Sendable (any Error) -> Void)?,
        commit: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let logger = self.logger
        let progress = WriteProgress()
        let backstop = max(.seconds(30), timeout * 3)
        return try await run(
            lateResult: lateResult,
            cancelsAtDeadline: {
                let abandoned = progress.deadline(failed: failed, backstop: backstop)
                if abandoned { logger.debug("a write gave up waiting for a connection at database.timeout; nothing was sent") }
                return abandoned
            }
        ) { client in
            try await Self.write(on: client, logger: logger, progress: progress, failed: failed, commit)
        }
    }

    private static func write<T: Sendable>(
        on client: PostgresClient, logger: Logger, progress: WriteProgress, failed: (@Sendable (any Error) -> Void)?,
        _ commit: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        do {
            let value = try await client.withConnection { connection in
                // Abandoned at the deadline before this: nothing is sent.
                guard progress.leased(closed: connection.closeFuture) else { throw CancellationError() }
                do {
                    return try await commit(connection)
                } catch {
                    if Self.spoilsPreparedStatements(error) {
                        logger.warning(
                            "a statement could not be prepared or planned; its connection is closed so that a new one prepares it again",
                            metadata: ["sqlstate": "\((error as? PSQLError)?.serverInfo?[.sqlState] ?? "")"])
                        try? await connection.close()
                    }
                    throw error
                }
            }
            // The deadline's hook (the connection closing under a write whose caller was
            // cancelled or answered at the deadline) may have reported this write as of unknown
            // outcome first, and its charges are then being given back: it is no success, however
            // it ended (review of #46, finding 4: a served call would have been refunded).
            guard progress.end(from: .onConnection) else { throw CommitUnacknowledged(reason: ConnectionLost()) }
            return value
        } catch {
            // Once: a write the deadline already reported is not reported again.
            if progress.end(from: .onConnection) || progress.end(from: .waiting) { failed?(error) }
            throw error
        }
    }

    /// An error after which a connection's prepared statements cannot be trusted: PostgresNIO
    /// keeps a statement whose preparation failed as failed for the connection's life (a function
    /// missing for a moment during a deploy would fail every later call on it), and PostgreSQL
    /// refuses a prepared statement whose result type changed (`0A000` "cached plan must not
    /// change result type"). Class 42 (an undefined function, table or column, a privilege), 0A
    /// (not supported), 26 (invalid statement name), 3F (invalid schema).
    static func spoilsPreparedStatements(_ error: any Error) -> Bool {
        guard let state = (error as? PSQLError)?.serverInfo?[.sqlState] else { return false }
        return ["42", "0A", "26", "3F"].contains(String(state.prefix(2)))
    }

    /// How often, and for how long, ``untilAvailable(_:)`` tries.
    static let retryInterval = Duration.seconds(2)
    static let retryAttempts = 300

    /// Runs `body` (which calls ``run(lateResult:_:)``) again, 2 seconds after each failure with
    /// ``DatabaseError/unavailable``, up to 300 times (10 minutes or more): for idempotent writes
    /// that must land eventually, such as giving a charge back. Any other error, or the last one,
    /// is thrown.
    public func untilAvailable<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        var attempt = 1
        while true {
            do {
                return try await body()
            } catch DatabaseError.unavailable where attempt < Self.retryAttempts {
                attempt += 1
                try await Task.sleep(for: Self.retryInterval)
            }
        }
    }

    /// Runs `body` in one transaction. Its COMMIT's answer is the acknowledgement: PostgreSQL
    /// withholds it when the synchronous wait is cut short (the primary stopping), and PostgresNIO
    /// ends `withTransaction` only when it came.
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
                // 25006 (read_only_sql_transaction): the host became a standby, or refuses
                // writes; with a multi-host URL the gateway moves to the new primary.
                if state.hasPrefix("08") || state.hasPrefix("57P") || state == "53300" || state == "25006" {
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
        if error is ChannelError || error is IOError || error is CommitUnacknowledged || error is ConnectionLost { return .unavailable }
        logger.error("database error", metadata: ["error": "\(String(reflecting: error))"])
        return .unavailable
    }
}

extension AsyncSequence {
    /// Every element, in order (for small, bounded results).
    public func collect() async throws -> [Element] {
        var out: [Element] = []
        for try await element in self { out.append(element) }
        return out
    }
}
