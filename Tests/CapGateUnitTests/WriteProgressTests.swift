import NIOCore
import NIOEmbedded
import Synchronization
import Testing

@testable import CapGate

/// What a write's deadline does (``WriteProgress``): a write still waiting for a connection is
/// abandoned and cancelled; one whose statements are on a connection is left to end, and is
/// reported as of unknown outcome only if its connection closes under it.
@Suite("A write's deadline")
struct WriteProgressTests {
    final class Reports: Sendable {
        let errors = Mutex<[String]>([])
        @Sendable func failed(_ error: any Error) { errors.withLock { $0.append(String(describing: type(of: error))) } }
        var count: Int { errors.withLock { $0.count } }
    }

    /// A write on a connection whose deadline has just passed.
    static func atDeadlineOnConnection() -> (EmbeddedEventLoop, EventLoopPromise<Void>, WriteProgress, Reports) {
        let loop = EmbeddedEventLoop()
        let closed = loop.makePromise(of: Void.self)
        let progress = WriteProgress()
        let reports = Reports()
        #expect(progress.leased(closed: closed.futureResult))
        #expect(!progress.deadline(failed: reports.failed, backstop: .seconds(60)))
        return (loop, closed, progress, reports)
    }

    @Test("waiting for a connection at the deadline: abandoned, cancelled, and a connection leased after it sends nothing")
    func waitingIsAbandoned() {
        let loop = EmbeddedEventLoop()
        let progress = WriteProgress()
        let reports = Reports()
        let closed = loop.makePromise(of: Void.self)
        #expect(progress.deadline(failed: reports.failed, backstop: .seconds(60)))
        #expect(!progress.leased(closed: closed.futureResult))
        #expect(!progress.end(from: .onConnection))
        #expect(!progress.end(from: .waiting))
        closed.succeed(())
        #expect(reports.count == 0)
    }

    @Test("on a connection at the deadline: not cancelled; its own end reports it, the connection's later close does not")
    func onConnectionIsLeftToEnd() {
        let (_, closed, progress, reports) = Self.atDeadlineOnConnection()
        #expect(reports.count == 0)
        // The write ended by itself (a commit, or an error its caller reports).
        #expect(progress.end(from: .onConnection))
        closed.succeed(())
        #expect(reports.count == 0)
    }

    @Test("on a connection that closes before the write ends: reported once as an unknown outcome")
    func closedUnderTheWrite() {
        let (_, closed, progress, reports) = Self.atDeadlineOnConnection()
        #expect(!progress.deadline(failed: reports.failed, backstop: .seconds(60)))
        closed.succeed(())
        #expect(reports.errors.withLock { $0 } == ["CommitUnacknowledged"])
        // The write's own end afterwards, failure or success, is not its to report: a success
        // is then thrown away as unknown by Database.write (its charges are being given back).
        #expect(!progress.end(from: .onConnection))
    }

    @Test("on a connection that neither answers nor closes: reported once as an unknown outcome at the backstop")
    func backstop() {
        let (loop, closed, _, reports) = Self.atDeadlineOnConnection()
        loop.advanceTime(by: .seconds(59))
        #expect(reports.count == 0)
        loop.advanceTime(by: .seconds(1))
        #expect(reports.errors.withLock { $0 } == ["CommitUnacknowledged"])
        closed.succeed(())
        #expect(reports.count == 1)
    }

    @Test("withDeadline answers at the deadline and cancels the body only when told to")
    func deadlineWithoutCancelling() async throws {
        for cancels in [true, false] {
            let (ended, continuation) = AsyncStream.makeStream(of: Bool.self)
            await #expect(throws: DeadlineExceeded.self) {
                try await withDeadline(
                    .milliseconds(50), lateResult: { _ in }, cancelsAtDeadline: { cancels }
                ) { () async throws -> Int in
                    // Not `Task.sleep`: it would end at once when cancelled, which is what is checked.
                    let until = ContinuousClock.now + .milliseconds(300)
                    while ContinuousClock.now < until && !Task.isCancelled { try? await Task.sleep(for: .milliseconds(5)) }
                    continuation.yield(Task.isCancelled)
                    return 1
                }
            }
            var iterator = ended.makeAsyncIterator()
            #expect(await iterator.next() == cancels)
        }
    }
}
