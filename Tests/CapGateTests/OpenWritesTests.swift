import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import CapGate

/// The ledger search of an interrupted admission first waits for the write transactions open when
/// it began (``OpenWrites``; the synchronous-standby case itself is in CommitAcknowledgementTests).
@Suite("A give-back's search waits for open writes", .timeLimit(.minutes(2)))
struct OpenWritesTests {
    @Test(
        "a write transaction open when the wait begins holds it (Pending after the bound); once it commits the wait ends; a read-only one does not count"
    )
    func waitsForOpenWrites() async throws {
        let url = try await TestCluster.freshDatabase()
        let client = PostgresClient(configuration: url.clientConfiguration(maxConnections: 4), backgroundLogger: TestCluster.logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            let database = Database(client: client, timeout: .seconds(10), logger: TestCluster.logger)

            // Nothing open: returns at once.
            try await OpenWrites.awaitEnd(database: database, wait: .milliseconds(200))

            // A read-only transaction holds no transaction id: not waited for.
            let (released, release) = AsyncStream.makeStream(of: Void.self)
            let (opened, openedContinuation) = AsyncStream.makeStream(of: Void.self)
            let reader = Task {
                try await client.withConnection { connection in
                    _ = try await connection.query("BEGIN", logger: TestCluster.logger).collect()
                    _ = try await connection.query("SELECT count(*) FROM companies", logger: TestCluster.logger).collect()
                    openedContinuation.yield()
                    var wait = released.makeAsyncIterator()
                    _ = await wait.next()
                    _ = try await connection.query("COMMIT", logger: TestCluster.logger).collect()
                }
            }
            var openedIterator = opened.makeAsyncIterator()
            _ = await openedIterator.next()
            try await OpenWrites.awaitEnd(database: database, wait: .milliseconds(200))
            release.yield()
            try await reader.value

            // A transaction that wrote (took an id) and stays open: the wait gives up, Pending.
            let (commits, commit) = AsyncStream.makeStream(of: Void.self)
            let (wrote, wroteContinuation) = AsyncStream.makeStream(of: Void.self)
            let writer = Task {
                try await client.withConnection { connection in
                    _ = try await connection.query("BEGIN", logger: TestCluster.logger).collect()
                    _ = try await connection.query("SELECT txid_current()", logger: TestCluster.logger).collect()
                    wroteContinuation.yield()
                    var wait = commits.makeAsyncIterator()
                    _ = await wait.next()
                    _ = try await connection.query("COMMIT", logger: TestCluster.logger).collect()
                }
            }
            var wroteIterator = wrote.makeAsyncIterator()
            _ = await wroteIterator.next()
            let started = ContinuousClock.now
            await #expect(throws: OpenWrites.Pending.self) {
                try await OpenWrites.awaitEnd(database: database, wait: .milliseconds(300))
            }
            #expect(ContinuousClock.now - started >= .milliseconds(300), "it waited its bound")

            // Open again while the writer commits part-way through the wait: the wait ends then.
            let done = Mutex(false)
            let waiting = Task {
                try await OpenWrites.awaitEnd(database: database, wait: .seconds(20))
                done.withLock { $0 = true }
            }
            try await Task.sleep(for: .milliseconds(300))
            #expect(!done.withLock { $0 }, "still waiting while the writer is open")
            commit.yield()
            try await writer.value
            let ended = ContinuousClock.now
            try await waiting.value
            #expect(ContinuousClock.now - ended < .seconds(5), "the wait ended once the writer committed")
        }
    }
}
