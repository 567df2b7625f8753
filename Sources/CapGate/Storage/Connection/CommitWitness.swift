import Logging
import NIOCore
import PostgresNIO

/// What CapGate knows of one write's transaction, from what its connection said in order.
///
/// A statement in PostgreSQL's implicit transaction is committed at the Sync that follows it,
/// after its rows and CommandComplete went out; PostgresNIO ends a statement's row stream at its
/// CommandComplete. With synchronous replication the commit then waits for the standby, and a
/// primary stopped during that wait (a fast shutdown, `pg_terminate_backend`, a failover engine
/// demoting it) warns "the transaction has already committed locally, but might not have been
/// replicated to the standby" and closes the connection without a ReadyForQuery: PostgreSQL
/// withholds the acknowledgement on purpose, and the commit may then be lost with the old
/// primary. So a statement's answer is not its commit. The commit is acknowledged by the
/// ReadyForQuery after the Sync (or an explicit COMMIT's CommandComplete, which PostgreSQL also
/// withholds then); PostgresNIO does not show ReadyForQuery, but sends the next statement queued
/// on the connection only once it has arrived, so a statement that runs after the write on the
/// same connection is the proof (``PostgresConnection/acknowledgeCommit(logger:)``).
///
/// The states and what each allows:
/// - `sent`: nothing answered yet;
/// - `answered`: the statements answered; committed or not is unknown until acknowledged;
/// - `committed`: acknowledged: act on it (forward the call, drop the spooled write);
/// - `rolledBack`: the server refused a statement before it answered (an error it sent): the
///   implicit transaction rolled back, nothing to give back;
/// - `unknown`: the connection broke (or the wait was abandoned) after the statement was sent:
///   it may have committed on this primary and may be lost with it; never act on it as a
///   commit, and give back whatever it may have charged.
struct CommitWitness: Sendable, Equatable {
    enum State: Sendable, Equatable {
        case sent
        case answered
        case committed
        case rolledBack
        case unknown
    }

    enum Event: Sendable, Equatable {
        /// The write's statements returned their results.
        case answered
        /// A statement queued after them on the same connection ran: ReadyForQuery came.
        case acknowledged
        /// The statement answered after committing inside itself: a procedure whose COMMIT (with
        /// its synchronous wait) runs before the CALL sends its row (``SelfCommittingStatement``).
        case answeredCommitted
        /// A statement failed with an error the server sent (a SQLSTATE).
        case serverError
        /// The connection closed or broke, or the caller stopped waiting (a deadline, a cancel).
        case lost
    }

    private(set) var state = State.sent

    /// Whether the write may be acted on as committed.
    var isCommitted: Bool { state == .committed }

    mutating func receive(_ event: Event) {
        switch (state, event) {
        case (.sent, .answered): state = .answered
        case (.sent, .serverError): state = .rolledBack
        case (.sent, .lost): state = .unknown
        // An acknowledgement without an answer is not one (a misuse): never taken as a commit.
        case (.sent, .acknowledged): state = .unknown
        case (.sent, .answeredCommitted): state = .committed
        case (.answered, .acknowledged): state = .committed
        // After the answer, any failure leaves the commit unknown: an error the server sends at
        // the commit (a deferred check) or a FATAL during the synchronous wait looks the same
        // from here as the proof statement failing.
        case (.answered, .serverError), (.answered, .lost), (.answered, .answered), (.answered, .answeredCommitted):
            state = .unknown
        // Final states stay.
        case (.committed, _), (.rolledBack, _), (.unknown, _): break
        }
    }

    /// What a write's caller is told of `error` from its statements, received here: the
    /// caller's own error, or one the server sent (rolled back), as it is; anything else as
    /// ``CommitUnacknowledged`` (it may have committed).
    mutating func failure(_ error: any Error) -> any Error {
        guard let event = Self.event(for: error) else { return error }
        receive(event)
        return state == .rolledBack ? error : CommitUnacknowledged(reason: error)
    }

    /// ``failure(_:)`` for an error met after the statement was sent and began answering (its
    /// rows being read): an error the server sent rolled it back; anything else leaves the commit
    /// unknown, including this side failing to read a row (a value it cannot decode, a row of
    /// the wrong shape), since the statement runs on to its Sync and commits all the same.
    mutating func failureAfterSending(_ error: any Error) -> any Error {
        receive(Self.event(for: error) ?? .lost)
        return state == .rolledBack ? error : CommitUnacknowledged(reason: error)
    }

    /// The state after `events`, in order.
    static func after(_ events: [Event]) -> State {
        var witness = CommitWitness()
        for event in events { witness.receive(event) }
        return witness.state
    }

    /// The event a failure of PostgresNIO's is: an error the server sent (a SQLSTATE), or a lost
    /// connection; nil for any other error (the caller's own, thrown by its code: passed on).
    static func event(for error: any Error) -> Event? {
        if let psql = error as? PSQLError { return event(sqlState: psql.serverInfo?[.sqlState]) }
        if error is CancellationError || error is ChannelError || error is IOError || error is ConnectionLost { return .lost }
        return nil
    }

    /// A PostgresNIO error's event by the SQLSTATE the server sent with it (nil: none, the
    /// connection closed or broke). Connection-class (08) and operator-intervention shutdown
    /// (57P) states mean the server is going away: it may have committed before saying so.
    /// ``commitUnacknowledgedState`` is CapGate's own: a procedure that committed and cannot
    /// say the synchronous standby has it.
    static func event(sqlState: String?) -> Event {
        guard let state = sqlState else { return .lost }
        if state == commitUnacknowledgedState { return .lost }
        return state.hasPrefix("08") || state.hasPrefix("57P") ? .lost : .serverError
    }

    /// Raised by `capgate_admit_committed` after its COMMIT when its synchronous wait may have
    /// been cut short (db/functions/capgate_admit_committed.sql).
    static let commitUnacknowledgedState = "CG001"
}

/// A write whose statements were answered, or may have run, but whose commit PostgreSQL did not
/// acknowledge: it may or may not stand on the primary that takes writes next.
public struct CommitUnacknowledged: Error, CustomStringConvertible {
    /// Why it was not acknowledged (the connection's error).
    public let reason: any Error

    public var description: String { "the commit was not acknowledged (\(String(describing: type(of: reason))))" }
}

/// The connection was closed before a statement could be sent on it.
public struct ConnectionLost: Error {}

/// Answers one row with no work: the proof statement after a write.
struct CommitAcknowledgementStatement: PostgresPreparedStatement {
    static let sql = "SELECT true"
    typealias Row = Bool

    func makeBindings() throws -> PostgresBindings { PostgresBindings() }
    func decodeRow(_ row: PostgresRow) throws -> Bool { try row.decode(Bool.self) }
}

/// A prepared statement that commits inside itself before it answers: a `CALL` of a procedure
/// whose COMMIT (and its wait for the synchronous standby) comes before its row, so the row is
/// the acknowledgement. Only for a statement run alone in its implicit transaction (PostgreSQL
/// refuses a COMMIT inside a procedure called in a transaction block).
protocol SelfCommittingStatement: PostgresPreparedStatement {}

extension PostgresConnection {
    /// Returns once the transaction of everything run before on this connection is acknowledged:
    /// a statement sent after them runs only once their ReadyForQuery came (PostgresNIO sends a
    /// connection's next statement then), which PostgreSQL sends only after the commit, and after
    /// the synchronous standby has it. One round trip, with no work on the server.
    func acknowledgeCommit(logger: Logger) async throws {
        try requireOpen()
        _ = try await execute(CommitAcknowledgementStatement(), logger: logger).collect()
    }

    /// Runs one prepared statement and returns its rows once PostgreSQL has acknowledged its
    /// commit, as ``committed(logger:_:)`` does, in the same round trips but sooner: the proof
    /// statement is queued as soon as the statement answers its first message, so PostgresNIO
    /// sends it from the event loop the moment the statement's ReadyForQuery arrives, while the
    /// rows are still being read (the hot path: admissions, settlements, slot ends). A statement
    /// that commits inside itself (``SelfCommittingStatement``: a procedure whose COMMIT, with its
    /// synchronous wait, comes before its row) is acknowledged by its rows, with no proof: one
    /// round trip. A primary stopped during either wait ends the connection without the
    /// acknowledgement: unknown.
    ///
    /// `answered` is called once the rows are collected, before the wait for the proof (never
    /// when the statement failed).
    func committedRows<Statement: PostgresPreparedStatement>(
        _ statement: Statement, logger: Logger, answered: (@Sendable () -> Void)? = nil
    ) async throws -> [Statement.Row] where Statement.Row: Sendable {
        var witness = CommitWitness()
        let rows: AsyncThrowingMapSequence<PostgresRowSequence, Statement.Row>
        do {
            try requireOpen()
            rows = try await execute(statement, logger: logger)
        } catch {
            throw witness.failure(error)
        }
        if Statement.self is any SelfCommittingStatement.Type {
            let collected: [Statement.Row]
            do {
                collected = try await rows.collect()
            } catch {
                throw witness.failureAfterSending(error)
            }
            witness.receive(.answeredCommitted)
            answered?()
            return collected
        }
        async let acknowledged: Void = acknowledgeCommit(logger: logger)
        let collected: [Statement.Row]
        do {
            collected = try await rows.collect()
        } catch {
            // The proof statement runs or fails on its own; its outcome changes nothing here.
            _ = try? await acknowledged
            throw witness.failureAfterSending(error)
        }
        witness.receive(.answered)
        answered?()
        do {
            try await acknowledged
            witness.receive(.acknowledged)
        } catch {
            witness.receive(CommitWitness.event(for: error) ?? .lost)
            throw CommitUnacknowledged(reason: error)
        }
        guard witness.isCommitted else { throw CommitUnacknowledged(reason: CancellationError()) }
        return collected
    }

    /// Throws ``ConnectionLost`` when the connection is already closed. PostgresNIO writes a
    /// statement to its channel without a promise: on a closed channel the write fails unseen and
    /// the statement never answers (seen when a primary stopped between a write's answer and its
    /// proof statement). What is left is the moment between this check and the write, which
    /// ``Database/write(lateResult:failed:_:)``'s deadline covers.
    func requireOpen() throws {
        guard !isClosed else { throw ConnectionLost() }
    }

    /// Runs `body` (statements in implicit transactions, or a whole explicit one) and returns its
    /// result once PostgreSQL has acknowledged their commit; throws ``CommitUnacknowledged`` when
    /// they answered (or may have run) and the acknowledgement did not come, and the statement's
    /// own error when the server refused it (rolled back).
    func committed<T>(logger: Logger, _ body: (PostgresConnection) async throws -> T) async throws -> T {
        var witness = CommitWitness()
        let value: T
        do {
            try requireOpen()
            value = try await body(self)
        } catch {
            // The caller's own error, or one the server sent (rolled back): passed on as it is.
            throw witness.failure(error)
        }
        witness.receive(.answered)
        do {
            try await acknowledgeCommit(logger: logger)
            witness.receive(.acknowledged)
        } catch {
            witness.receive(CommitWitness.event(for: error) ?? .lost)
            throw CommitUnacknowledged(reason: error)
        }
        guard witness.isCommitted else { throw CommitUnacknowledged(reason: CancellationError()) }
        return value
    }
}
