import NIOCore
import Testing

@testable import CapGate

/// What decides that a write committed (``CommitWitness``), without a socket: only an answer
/// followed by the acknowledgement is a commit; a failure before the answer with an error the
/// server sent is a rollback; everything else is unknown.
@Suite("Commit witness")
struct CommitWitnessTests {
    typealias Event = CommitWitness.Event

    @Test("answered, then acknowledged: committed; the answer alone is not")
    func committedOnlyWhenAcknowledged() {
        #expect(CommitWitness.after([.answered, .acknowledged]) == .committed)
        #expect(CommitWitness.after([.answered]) == .answered)
        #expect(CommitWitness().isCommitted == false)
        var witness = CommitWitness()
        witness.receive(.answered)
        #expect(!witness.isCommitted)
        witness.receive(.acknowledged)
        #expect(witness.isCommitted)
    }

    @Test("answered, then the connection lost or an error at the commit: unknown (the synchronous wait cut short)")
    func answeredThenLost() {
        #expect(CommitWitness.after([.answered, .lost]) == .unknown)
        #expect(CommitWitness.after([.answered, .serverError]) == .unknown)
        // A second answer without an acknowledgement between is not a commit either.
        #expect(CommitWitness.after([.answered, .answered, .acknowledged]) == .unknown)
    }

    @Test("before any answer: an error the server sent rolled back, a lost connection is unknown")
    func beforeTheAnswer() {
        #expect(CommitWitness.after([.serverError]) == .rolledBack)
        #expect(CommitWitness.after([.lost]) == .unknown)
        // An acknowledgement with nothing answered is never taken as a commit.
        #expect(CommitWitness.after([.acknowledged]) == .unknown)
        #expect(CommitWitness.after([]) == .sent)
    }

    @Test(
        "a statement that commits inside itself (a procedure's COMMIT before its row): its answer is the commit; after a plain answer it is not"
    )
    func selfCommitting() {
        #expect(CommitWitness.after([.answeredCommitted]) == .committed)
        // An answer then another kind of answer is a misuse: never a commit.
        #expect(CommitWitness.after([.answered, .answeredCommitted]) == .unknown)
        // The connection lost or the server's error before the row: as for any statement.
        #expect(CommitWitness.after([.lost, .answeredCommitted]) == .unknown)
        #expect(CommitWitness.after([.serverError, .answeredCommitted]) == .rolledBack)
        #expect(CommitWitness.after([.answeredCommitted, .lost]) == .committed)
    }

    @Test("final states stay whatever comes after")
    func finalStatesStay() {
        let events: [Event] = [.answered, .acknowledged, .answeredCommitted, .serverError, .lost]
        for tail in events {
            #expect(CommitWitness.after([.answered, .acknowledged, tail]) == .committed)
            #expect(CommitWitness.after([.serverError, tail]) == .rolledBack)
            #expect(CommitWitness.after([.lost, tail]) == .unknown)
        }
    }

    @Test("errors as events: SQLSTATEs of a server going away are a lost connection, others the server's refusal")
    func errorsAsEvents() {
        #expect(CommitWitness.event(sqlState: nil) == .lost)
        // admin_shutdown (the fast stop's FATAL), crash_shutdown, cannot_connect_now
        // and CapGate's own CG001 (a procedure that committed but whose synchronous wait may have been cut)
        for state in ["57P01", "57P02", "57P03", "08006", "08003", "CG001"] {
            #expect(CommitWitness.event(sqlState: state) == .lost, "\(state)")
        }
        // unique_violation, check_violation, query_canceled, serialization_failure, raise_exception
        for state in ["23505", "23514", "57014", "40001", "P0001"] {
            #expect(CommitWitness.event(sqlState: state) == .serverError, "\(state)")
        }
        #expect(CommitWitness.event(for: CancellationError()) == .lost)
        #expect(CommitWitness.event(for: ChannelError.ioOnClosedChannel) == .lost)
        // The caller's own errors are not the connection's: passed on as they are.
        #expect(CommitWitness.event(for: DatabaseError.other("x")) == nil)
    }

    @Test(
        "an error of this side's while the statement's rows are read (a row it cannot decode) leaves the commit unknown; before sending it is the caller's own"
    )
    func readingFailure() {
        struct CannotDecode: Error {}
        var reading = CommitWitness()
        #expect(reading.failureAfterSending(CannotDecode()) is CommitUnacknowledged)
        #expect(!reading.isCommitted)
        var lost = CommitWitness()
        #expect(lost.failureAfterSending(ChannelError.ioOnClosedChannel) is CommitUnacknowledged)
        // Before anything was sent (the bindings could not be made), it stays the caller's.
        var before = CommitWitness()
        #expect(before.failure(CannotDecode()) is CannotDecode)
    }
}
