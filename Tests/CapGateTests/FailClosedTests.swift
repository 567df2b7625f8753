import CapGate
import Foundation
import Testing

@Suite("Fail closed", .timeLimit(.minutes(5)))
struct FailClosedTests {
    /// A migrated cluster of the test's own (the shared one must not be stopped or frozen).
    static func withOwnCluster(_ body: (EmbeddedPostgres) async throws -> Void) async throws {
        let folder = NSTemporaryDirectory() + "capgate-failclosed-\(UUID().uuidString)"
        let cluster = try await offPool {
            try EmbeddedPostgres.start(directory: folder, settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        defer {
            cluster.stop()
            try? FileManager.default.removeItem(atPath: folder)
        }
        _ = try await CapGateRunner.migrate(url: cluster.url, dryRun: false, logger: TestCluster.logger)
        try await body(cluster)
    }

    @Test("database down during traffic: 503 and nothing forwarded, then recovery without a restart")
    func databaseDown() async throws {
        // A cluster of its own: this test stops it.
        try await Self.withOwnCluster { cluster in try await self.databaseDown(cluster) }
    }

    func databaseDown(_ cluster: EmbeddedPostgres) async throws {
        try await Harness.with(database: cluster.url, settings: ["database.timeout": "2"]) { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let (_, users) = try await h.createCompany(plan: "low", users: 1)
            #expect(try await h.message(key: users[0].key).status == 200)
            let forwarded = h.mock.counter.count

            try await offPool { cluster.kill() }
            for _ in 0..<3 {
                let reply = try await h.message(key: users[0].key)
                #expect(reply.status == 503)
                #expect(reply.json["error"]?["type"]?.stringValue == "overloaded_error")
            }
            #expect(h.mock.counter.count == forwarded)
            let ready = try await h.request(.GET, "/readyz")
            #expect(ready.status == 503)

            try await offPool { try cluster.restart() }
            var recovered = false
            for _ in 0..<40 {
                if try await h.message(key: users[0].key).status == 200 {
                    recovered = true
                    break
                }
                try await Task.sleep(for: .milliseconds(500))
            }
            #expect(recovered)
            #expect(try await h.request(.GET, "/readyz").status == 200)
        }
    }

    @Test("database that stops answering: 503 by database.timeout, nothing forwarded, late commits given back")
    func databaseStalls() async throws {
        // A cluster of its own: this test freezes it (SIGSTOP), as a stalled server or a network
        // partition would look to the gateway: connections stay open and nothing answers.
        try await Self.withOwnCluster { cluster in try await self.databaseStalls(cluster) }
    }

    func databaseStalls(_ cluster: EmbeddedPostgres) async throws {
        try await Harness.with(database: cluster.url, settings: ["database.timeout": "1"]) { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let (company, users) = try await h.createCompany(plan: "low", users: 2)
            #expect(try await h.message(key: users[0].key).status == 200)
            let forwarded = h.mock.counter.count

            let frozen = try ClusterFreeze(cluster)
            let started = ContinuousClock.now
            let replies = try await withThrowingTaskGroup(of: Harness.Reply.self) { group in
                for i in 0..<20 {
                    group.addTask {
                        let headers = i % 4 == 0 ? [("idempotency-key", "stalled-\(i)")] : []
                        return try await h.message(key: users[i % 2].key, headers: headers)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let waited = ContinuousClock.now - started
            frozen.thaw()

            // The first call's batch and the batch of the calls queued behind it each wait
            // database.timeout: every caller is answered within two of them.
            #expect(waited < .seconds(4))
            #expect(replies.allSatisfy { $0.status == 503 })
            #expect(replies.allSatisfy { $0.json["error"]?["type"]?.stringValue == "overloaded_error" })
            #expect(h.mock.counter.count == forwarded)

            // PostgreSQL commits the stalled admissions once it runs again (their statements
            // were sent before it froze); the gateway gives every one of their charges back, so
            // only the one forwarded call stays charged.
            let refunded = try await h.eventually(
                "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'refunded'", equals: 20,
                within: .seconds(20))
            #expect(refunded == 20)
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'") == 1)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
        }
    }
}

/// SIGSTOP for a test cluster's postmaster and all its children (backends, WAL writer, …);
/// ``thaw()`` (also on deinit) sends SIGCONT. Only processes this test run started.
final class ClusterFreeze: Sendable {
    let pids: [pid_t]

    init(_ cluster: EmbeddedPostgres) throws {
        let pidFile = try String(contentsOfFile: cluster.dataDirectory + "/postmaster.pid", encoding: .utf8)
        guard let line = pidFile.split(separator: "\n").first, let postmaster = pid_t(line) else {
            throw CocoaError(.fileReadCorruptFile)
        }
        // The postmaster first, so that it forks nothing while its children are listed.
        kill(postmaster, SIGSTOP)
        var pids = [postmaster]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = pid_t(entry), let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                let nameEnd = stat.lastIndex(of: ")")
            else { continue }
            // "pid (name) state ppid …": the name may hold spaces, so read after its ")".
            let fields = stat[stat.index(after: nameEnd)...].split(separator: " ")
            if fields.count > 1, pid_t(fields[1]) == postmaster {
                kill(pid, SIGSTOP)
                pids.append(pid)
            }
        }
        self.pids = pids
    }

    func thaw() {
        for pid in pids { kill(pid, SIGCONT) }
    }

    deinit { thaw() }
}
