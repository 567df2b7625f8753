import CapGate
import CapGateDev
import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import CapGate

#if canImport(Glibc)
    import Glibc
#endif

/// A charge is acknowledged by its commit, never by its statement's answer (issue #46): a
/// primary stopped while an admission's commit waits for the synchronous standby answers the
/// admission's rows and then withholds the acknowledgement; the charge lives only on that
/// primary and is lost with it. Real processes: a primary with a synchronous standby
/// (``EmbeddedReplicaSet``), the standby's WAL receiver paused (SIGSTOP) so every commit waits.
@Suite("Commit acknowledgement", .serialized, .timeLimit(.minutes(5)))
struct CommitAcknowledgementTests {
    @Test(
        "the primary fast-stopped while admissions wait for the synchronous standby: none of the calls is forwarded (single call, Idempotency-Key call, a batch), the promoted standby serves again, served == charged, verify clean"
    )
    func stoppedDuringSynchronousWait() async throws {
        try await HeavyTests.alone { try await Self.stoppedDuringSynchronousWaitAlone() }
    }

    static func stoppedDuringSynchronousWaitAlone() async throws {
        let logger = TestCluster.logger
        let folder = NSTemporaryDirectory() + "capgate-commit-ack-\(UUID().uuidString)"
        // wal_sender_timeout: the stopped primary's shutdown waits for its walsender, which waits
        // for the paused receiver; 2 s instead of 60.
        let set = try await offPool {
            try EmbeddedReplicaSet.start(
                directory: folder, settings: ["fsync": "off", "wal_sender_timeout": "2000"], logger: TestCluster.logger)
        }
        let receiver = Mutex<pid_t?>(nil)
        defer {
            if let pid = receiver.withLock({ $0 }) { kill(pid, SIGCONT) }
            set.standby.stop()
            if let pid = set.primary.postmasterPID, kill(pid, 0) == 0 { set.primary.stop() }
            try? FileManager.default.removeItem(atPath: folder)
        }
        _ = try await CapGateRunner.migrate(url: set.url, dryRun: false, logger: logger)
        let standbyURL = set.url.only(set.url.hosts[1])

        try await Harness.with(database: set.url, settings: ["database.timeout": "10"]) { h in
            try await h.createPlan("big", company: 1_000_000, user: 1_000_000)
            // A company per path, so that each admission waits for the standby itself (within one
            // company the others would wait for its counter row's lock).
            let (_, alone) = try await h.createCompany(plan: "big", users: 1)
            let (_, keyed) = try await h.createCompany(plan: "big", users: 1)
            let (batched, batchUsers) = try await h.createCompany(plan: "big", users: 1)
            #expect(try await h.message(key: alone[0].key).status == 200)
            let servedBefore = h.mock.served.count
            #expect(servedBefore == 1)

            // The batch path on a database of its own that follows the primary as the gateway's
            // does (its give-backs must reach the promoted standby too).
            let (batchDatabase, batchService) = await Database.connect(
                url: set.url, maxConnections: 2, timeout: .seconds(10), logger: logger)
            let batchRunning = Task { try await batchService.run() }
            defer { batchRunning.cancel() }

            // Every commit on the primary now waits for the standby, which never confirms.
            let pid = try await offPool { try set.standby.psql("SELECT pid FROM pg_stat_wal_receiver").trimmingWhitespace() }
            let walReceiver = try #require(pid_t(pid), "no WAL receiver on the standby: '\(pid)'")
            #expect(kill(walReceiver, SIGSTOP) == 0)
            receiver.withLock { $0 = walReceiver }

            // The three admission paths, all waiting in the synchronous wait: a call alone (a
            // batch of one, capgate_admit), a call with an Idempotency-Key (its own
            // transaction), and a batch of three (capgate_admit_batch).
            async let single = h.message(key: alone[0].key)
            async let idempotent = h.message(key: keyed[0].key, headers: [("idempotency-key", "commit-ack-\(UUID().uuidString)")])
            async let batch = MeteringStore.admitBatch(
                (0..<3).map { i in
                    AdmissionItem(
                        keyHash: nil,
                        request: AdmissionRequest(
                            companyID: batched, userID: batchUsers[0].id, units: 1, method: "POST", route: "/v1/messages",
                            model: "claude-test", requestID: "req_commit_ack_\(i)", at: Date(),
                            bound: CostBound(prompt: .wholeWindow, maxTokens: 16, cache: .none, window: nil)))
                }, database: batchDatabase, relaxed: false)
            try await Task.sleep(for: .milliseconds(1_500))
            let waiting = try await offPool {
                try set.primary.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").trimmingWhitespace()
            }
            // `pg_ctl stop -m fast`: PostgreSQL cancels the waits ("committed locally, but might
            // not have been replicated") and ends the connections without acknowledging.
            let stopped = Task { try await offPool { set.primary.stop() } }

            let (singleReply, idempotentReply) = try await (single, idempotent)
            let batchResults = await batch
            print(
                "commit acknowledgement: \(waiting) sessions waited for the standby; single \(singleReply.status), idempotent \(idempotentReply.status), batch \(batchResults.map { (try? $0.get()) == nil ? "failed" : "answered" })"
            )
            #expect(Int(waiting) ?? 0 >= 3, "the admissions were waiting for the synchronous standby")
            #expect(singleReply.status == 503, "\(singleReply.status): \(singleReply.body)")
            #expect(idempotentReply.status == 503, "\(idempotentReply.status): \(idempotentReply.body)")
            #expect(batchResults.count == 3)
            for result in batchResults {
                if case .success(let row) = result { Issue.record("a batch call was taken as admitted: \(row.decision?.rawValue ?? "")") }
            }
            // Nothing was forwarded.
            #expect(h.mock.served.count == servedBefore)

            try await stopped.value
            #expect(kill(walReceiver, SIGCONT) == 0)
            receiver.withLock { $0 = nil }
            try await offPool { try set.standby.promote() }

            // The gateway finds the promoted standby and serves again.
            var status = 0
            let deadline = ContinuousClock.now + .seconds(30)
            while status != 200 && ContinuousClock.now < deadline {
                status = (try? await h.message(key: alone[0].key).status) ?? 0
                if status != 200 { try await Task.sleep(for: .milliseconds(250)) }
            }
            #expect(status == 200, "no call succeeded on the promoted standby")

            // Served == charged on the surviving node, once any give-back (database.timeout + 1 s
            // after a statement whose outcome was unknown) is done.
            let served = Int64(h.mock.served.count)
            var charged: Int64 = -1
            let settle = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < settle {
                charged = try await CapGateRunner.withClient(url: standbyURL, logger: logger) { client in
                    let rows = try await client.query(
                        "SELECT count(*)::int8 FROM usage_ledger WHERE outcome = 'charged'", logger: logger)
                    for try await count in rows.decode(Int64.self) { return count }
                    return -1
                }
                if charged == served { break }
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(charged == served, "charged \(charged), served \(served)")
        }
        let mismatches = try await CapGateRunner.verify(url: standbyURL, logger: logger)
        #expect(mismatches.isEmpty, "\(mismatches)")
    }
}
