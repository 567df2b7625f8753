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

    @Test(
        "a lone call's CALL whose commit waits for the standby past statement_timeout: PostgreSQL cuts the wait and commits locally, and the procedure withholds the row (CG001, an unknown outcome), never answers it as acknowledged"
    )
    func timeoutDuringSynchronousWait() async throws {
        try await HeavyTests.alone { try await Self.timeoutDuringSynchronousWaitAlone() }
    }

    static func timeoutDuringSynchronousWaitAlone() async throws {
        let folder = NSTemporaryDirectory() + "capgate-commit-timeout-\(UUID().uuidString)"
        let set = try await offPool {
            try EmbeddedReplicaSet.start(directory: folder, settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        let receiver = Mutex<pid_t?>(nil)
        defer {
            if let pid = receiver.withLock({ $0 }) { kill(pid, SIGCONT) }
            set.standby.stop()
            set.primary.stop()
            try? FileManager.default.removeItem(atPath: folder)
        }
        _ = try await CapGateRunner.migrate(url: set.url, dryRun: false, logger: TestCluster.logger)
        try await Harness.with(database: set.url) { h in
            try await h.createPlan("big", company: 1_000_000, user: 1_000_000)
            let (company, users) = try await h.createCompany(plan: "big", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            let outs = Array(repeating: "NULL", count: AdmittedColumn.names.count).joined(separator: ", ")
            let call = """
                CALL capgate_admit_committed(NULL, '\(company.text)', '\(users[0].id.text)', 1, 'POST', '/v1/messages', NULL,
                     NULL, 'req_timeout', NULL, now(), false, NULL, NULL, 0::smallint, NULL, '{}', \(outs))
                """
            // With the standby keeping up, the CALL answers its row (charged).
            let answered = try await h.db.withConnection { connection in
                try await connection.query("SET statement_timeout = '2s'", logger: TestCluster.logger)
                return try await connection.query(PostgresQuery(unsafeSQL: call), logger: TestCluster.logger).collect().count
            }
            #expect(answered == 1)

            let pid = try await offPool { try set.standby.psql("SELECT pid FROM pg_stat_wal_receiver").trimmingWhitespace() }
            let walReceiver = try #require(pid_t(pid), "no WAL receiver on the standby: '\(pid)'")
            #expect(kill(walReceiver, SIGSTOP) == 0)
            receiver.withLock { $0 = walReceiver }
            let refused: String? = try await h.db.withConnection { connection in
                try await connection.query("SET statement_timeout = '500ms'", logger: TestCluster.logger)
                do {
                    _ = try await connection.query(PostgresQuery(unsafeSQL: call), logger: TestCluster.logger).collect()
                    return nil
                } catch let error as PSQLError {
                    return error.serverInfo?[.sqlState]
                }
            }
            #expect(refused == "CG001", "the row was answered although the standby never had the commit")
            #expect(CommitWitness.event(sqlState: refused) == .lost)
            // It did commit, locally: the outcome is unknown, not a rollback.
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE request_id = 'req_timeout'") == 2)
        }
    }

    @Test(
        "a commit still waiting for the standby when the gateway stops: its give-back waits in the spool for that commit to end, then gives it back (served == charged, verify clean)"
    )
    func commitPendingAcrossRestart() async throws {
        try await HeavyTests.alone { try await Self.commitPendingAcrossRestartAlone() }
    }

    /// Review of #46, finding 2: `statement_timeout` does not end the synchronous wait, and a
    /// backend waiting in it does not notice its client closed. The call is answered 503 at
    /// `database.timeout` (1 s), the gateway stops (its connection closes, the give-back goes to
    /// the spool), a new gateway starts on the same spool while the commit still waits: its
    /// search must not conclude "nothing charged" before that commit ended. Then the standby
    /// confirms, the commit lands, and the spooled give-back refunds it.
    static func commitPendingAcrossRestartAlone() async throws {
        let logger = TestCluster.logger
        let folder = NSTemporaryDirectory() + "capgate-commit-pending-\(UUID().uuidString)"
        let spoolFolder = folder + "-spool"
        let set = try await offPool {
            try EmbeddedReplicaSet.start(directory: folder, settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        let receiver = Mutex<pid_t?>(nil)
        defer {
            if let pid = receiver.withLock({ $0 }) { kill(pid, SIGCONT) }
            set.standby.stop()
            set.primary.stop()
            try? FileManager.default.removeItem(atPath: folder)
            try? FileManager.default.removeItem(atPath: spoolFolder)
        }
        _ = try await CapGateRunner.migrate(url: set.url, dryRun: false, logger: logger)
        let settings = ["database.timeout": "1", "spool.directory": spoolFolder]
        let charged: @Sendable () async throws -> Int64 = {
            try await CapGateRunner.withClient(url: set.url, logger: logger) { client in
                let rows = try await client.query("SELECT count(*)::int8 FROM usage_ledger WHERE outcome = 'charged'", logger: logger)
                for try await count in rows.decode(Int64.self) { return count }
                return -1
            }
        }
        let waitingForStandby: @Sendable () async throws -> Int = {
            try await offPool {
                Int(try set.primary.psql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").trimmingWhitespace()) ?? -1
            }
        }

        // The first gateway: one call served, then one whose commit waits for the paused standby.
        let key = Mutex<String>("")
        let servedFirst = Mutex(0)
        try await Harness.with(database: set.url, settings: settings) { h in
            try await h.createPlan("big", company: 1_000_000, user: 1_000_000)
            let (_, users) = try await h.createCompany(plan: "big", users: 1)
            key.withLock { $0 = users[0].key }
            #expect(try await h.message(key: users[0].key).status == 200)

            let pid = try await offPool { try set.standby.psql("SELECT pid FROM pg_stat_wal_receiver").trimmingWhitespace() }
            let walReceiver = try #require(pid_t(pid), "no WAL receiver on the standby: '\(pid)'")
            #expect(kill(walReceiver, SIGSTOP) == 0)
            receiver.withLock { $0 = walReceiver }

            // An Idempotency-Key call: its admission commits at the statement's Sync, a wait no
            // timeout ends (a lone call's CALL commits inside its statement, whose
            // statement_timeout cuts the wait: ``timeoutDuringSynchronousWait``).
            let reply = try await h.message(key: users[0].key, headers: [("idempotency-key", "pending-1")])
            #expect(reply.status == 503, "\(reply.status): \(reply.body)")
            #expect(try await waitingForStandby() >= 1, "the admission's commit waits for the standby")
            servedFirst.withLock { $0 = h.mock.served.count }
        }
        #expect(servedFirst.withLock { $0 } == 1, "the call answered 503 was not forwarded")
        // The gateway stopped and its connection closed; PostgreSQL still waits for the standby.
        #expect(try await waitingForStandby() >= 1, "the commit still waits after the gateway stopped")
        let spooled = (try? FileManager.default.contentsOfDirectory(atPath: spoolFolder)) ?? []
        #expect(!spooled.isEmpty, "the give-back of the unknown outcome is in the spool")

        // A new gateway on the same spool, while the commit still waits: its replays must wait
        // for that transaction, not find nothing and drop the give-back.
        let capture = LogCapture()
        try await Harness.with(database: set.url, settings: settings, gatewayLogger: capture.logger(level: .info)) { h in
            let waited = ContinuousClock.now + .seconds(30)
            while capture.matching("a give-back waits").isEmpty && ContinuousClock.now < waited {
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(!capture.matching("a give-back waits").isEmpty, "the replay saw the open transaction and waited")
            #expect(
                ((try? FileManager.default.contentsOfDirectory(atPath: spoolFolder)) ?? []).count == spooled.count,
                "the give-back stays in the spool while the commit is pending")

            // The standby confirms: the commit lands, then the next replay gives it back.
            let walReceiver = try #require(receiver.withLock { $0 })
            #expect(kill(walReceiver, SIGCONT) == 0)
            receiver.withLock { $0 = nil }
            var count: Int64 = -1
            let settle = ContinuousClock.now + .seconds(60)
            while ContinuousClock.now < settle {
                count = try await charged()
                let left = ((try? FileManager.default.contentsOfDirectory(atPath: spoolFolder)) ?? []).count
                if count == 1 && left == 0 { break }
                try await Task.sleep(for: .milliseconds(250))
            }
            #expect(count == 1, "charged \(count) for 1 call served")
            // The company serves again: served == charged.
            #expect(try await h.message(key: key.withLock { $0 }).status == 200)
            #expect(try await charged() == Int64(h.mock.served.count) + 1, "the first gateway's call and this one")
        }
        let mismatches = try await CapGateRunner.verify(url: set.url, logger: logger)
        #expect(mismatches.isEmpty, "\(mismatches)")
    }
}
