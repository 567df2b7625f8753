import CapGate
import CapGateDev
import Foundation
import PostgresNIO
import Synchronization
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

    typealias Company = (company: UUID, users: [(id: UUID, key: String)])

    /// A plan and a company with `users` API keys, made through a gateway with the harness's
    /// generous database timeout: a loaded machine can exceed a test's short one while setting up.
    static func company(on url: DatabaseURL, users: Int) async throws -> Company {
        let made = Mutex<Company?>(nil)
        try await Harness.with(database: url) { h in
            try await h.createPlan("low", company: 1000, user: 1000)
            let company = try await h.createCompany(plan: "low", users: users)
            made.withLock { $0 = company }
        }
        return try #require(made.withLock { $0 })
    }

    /// Calls until one is answered 200, at most `attempts` times, half a second apart. A call
    /// answered 503 was not forwarded; if its admission committed after the deadline, its
    /// charge was given back.
    static func firstSuccess(_ h: Harness, key: String, attempts: Int) async throws -> Bool {
        for _ in 0..<attempts {
            if try await h.message(key: key).status == 200 { return true }
            try await Task.sleep(for: .milliseconds(500))
        }
        return false
    }

    /// `SELECT count(*)` of the ledger rows of these replies' request ids with this outcome.
    static func rows(_ replies: [Harness.Reply], outcome: String) -> String {
        let ids = replies.compactMap { $0.headers.first(name: "request-id") }.map { "'\($0)'" }.joined(separator: ",")
        return "SELECT count(*) FROM usage_ledger WHERE request_id IN (\(ids.isEmpty ? "''" : ids)) AND outcome = '\(outcome)'"
    }

    /// A gateway with `database.timeout` set to `timeout` seconds on a cluster of the test's own,
    /// and a company with `users` members, after one call answered 200.
    static func withOwnGateway(
        users: Int, timeout: String, _ body: @Sendable (EmbeddedPostgres, Company, Harness) async throws -> Void
    ) async throws {
        try await withOwnCluster { cluster in
            let made = try await company(on: cluster.url, users: users)
            try await Harness.with(database: cluster.url, settings: ["database.timeout": timeout]) { h in
                #expect(try await firstSuccess(h, key: made.users[0].key, attempts: 10))
                try await body(cluster, made, h)
            }
        }
    }

    @Test("database down during traffic: 503 and nothing forwarded, a refund it blocked lands later, recovery without a restart")
    func databaseDown() async throws {
        // This test stops the cluster and starts it again.
        try await Self.withOwnGateway(users: 1, timeout: "2") { cluster, made, h in
            let (company, users) = made
            // A call the provider fails after 1.5 s, while the database goes down under it: its
            // refund cannot be written then, and must land once the database is back.
            let before = h.mock.counter.count
            let failing = Task {
                try await h.message(key: users[0].key, headers: [("x-mock-status", "500"), ("x-mock-delay-ms", "1500")])
            }
            // Charged and forwarded: the provider has it.
            for _ in 0..<200 where h.mock.counter.count == before { try await Task.sleep(for: .milliseconds(10)) }
            let forwarded = h.mock.counter.count
            #expect(forwarded == before + 1)

            try await offPool { cluster.kill() }
            for _ in 0..<3 {
                let reply = try await h.message(key: users[0].key)
                #expect(reply.status == 503)
                #expect(reply.json["error"]?["type"]?.stringValue == "overloaded_error")
            }
            #expect(h.mock.counter.count == forwarded)
            let ready = try await h.request(.GET, "/readyz")
            #expect(ready.status == 503)
            #expect(ready.json["error"]?["type"]?.stringValue == "overloaded_error")
            #expect(ready.json["status"]?.stringValue == "database_unreachable")
            let failed = try await failing.value
            #expect(failed.status == 500)

            try await offPool { try cluster.restart() }
            #expect(try await Self.firstSuccess(h, key: users[0].key, attempts: 40))
            #expect(try await h.request(.GET, "/readyz").status == 200)

            // The failed call's refund is written once the database is back; only the two
            // answered calls stay charged.
            #expect(try await h.eventually(Self.rows([failed], outcome: "refunded"), equals: 1, within: .seconds(20)) == 1)
            let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'"
            #expect(try await h.eventually(charged, equals: 2) == 2)
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("database that stops answering: 503 by database.timeout, nothing forwarded, late commits given back")
    func databaseStalls() async throws {
        // This test freezes the cluster (SIGSTOP), as a stalled server or a network partition
        // would look to the gateway: connections stay open and nothing answers.
        try await Self.withOwnGateway(users: 2, timeout: "1") { cluster, made, h in
            let (company, users) = made
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

            // Each admission batch waits database.timeout (1 s); a call waits for the batch in
            // flight when it arrives and for its own: about 2 s when the 20 arrive together, a
            // batch or two more when a loaded machine spreads their arrival (4.4 s seen once in
            // a full-suite run). Without the deadline they would wait until the thaw, which
            // comes only after every reply.
            #expect(waited < .seconds(8))
            #expect(replies.allSatisfy { $0.status == 503 })
            #expect(replies.allSatisfy { $0.json["error"]?["type"]?.stringValue == "overloaded_error" })
            #expect(h.mock.counter.count == forwarded)

            // PostgreSQL commits the stalled admissions once it runs again (their statements
            // were sent before it froze); the gateway gives every one of their charges back.
            // Calls that gave up while still queued were never sent (no ledger row at all), so
            // none of these calls stays charged and at least the batch in flight was refunded.
            #expect(
                try await h.eventually("SELECT least(1, (\(Self.rows(replies, outcome: "refunded"))))", equals: 1, within: .seconds(20))
                    == 1)
            #expect(try await h.eventually(Self.rows(replies, outcome: "charged"), equals: 0) == 0)
            let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'"
            // Ledger and counter read in one snapshot: a stalled statement that commits between
            // two separate reads (then given back) made them disagree for a moment once.
            let used = "SELECT used FROM company_usage WHERE company_id = '\(company.text)'"
            #expect(try await h.eventually("SELECT (\(charged)) * 10 + (\(used))", equals: 11) == 11)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            #expect(try await Self.firstSuccess(h, key: users[0].key, attempts: 10))
            #expect(try await h.eventually(charged, equals: 2) == 2)
        }
    }

    @Test(
        "an admission stalled past its deadline is left to end: when the server resumes it commits, and its own late result gives the charge back (no ledger search racing the commit)"
    )
    func stalledAdmissionEndsByItself() async throws {
        try await Self.withOwnCluster { cluster in
            let (company, users) = try await Self.company(on: cluster.url, users: 1)
            let log = LogCapture()
            try await Harness.with(database: cluster.url, settings: ["database.timeout": "1"], gatewayLogger: log.logger(level: .debug)) {
                h in
                #expect(try await Self.firstSuccess(h, key: users[0].key, attempts: 10))
                let charged = "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'"
                let unsettled =
                    "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged' AND settled_at IS NULL"
                let late = "committed after its callers were answered 503"
                let unsent = "gave up waiting for a connection at database.timeout"
                // The admission must be on a connection when the server freezes. A write still
                // waiting for one (a settlement held the idle connection, and the new one's
                // handshake met the frozen server) gives up unsent: a correct outcome, but not
                // the one under test, so that attempt is repeated.
                for _ in 0..<4 where log.matching(late).isEmpty {
                    #expect(try await h.eventually(unsettled, equals: 0) == 0)
                    let forwarded = h.mock.counter.count
                    let gaveUp = log.matching(unsent).count
                    let frozen = try ClusterFreeze(cluster)
                    let reply = try await h.message(key: users[0].key)
                    #expect(reply.status == 503)
                    // Past the moment a search of the ledger would have run (database.timeout +
                    // 1 s) and found nothing, the server frozen all along.
                    try await Task.sleep(for: .seconds(3))
                    frozen.thaw()
                    #expect(h.mock.counter.count == forwarded)
                    let ended = ContinuousClock.now
                    while log.matching(late).isEmpty, log.matching(unsent).count == gaveUp, ContinuousClock.now - ended < .seconds(20) {
                        try await Task.sleep(for: .milliseconds(100))
                    }
                    #expect(try await h.eventually(charged, equals: 1, within: .seconds(20)) == 1)
                }
                #expect(!log.matching(late).isEmpty, "\(log.matching(" 503") + log.matching(unsent))")
                #expect(log.matching("ended without a known outcome").isEmpty, "\(log.matching("outcome"))")
                #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            }
        }
    }

    @Test("the gateway's connections carry database.timeout as statement_timeout: the server ends what it stopped waiting for")
    func statementTimeout() async throws {
        let url = try await TestCluster.freshDatabase()
        let client = PostgresClient(
            configuration: url.clientConfiguration(maxConnections: 1, statementTimeout: .milliseconds(1500)),
            backgroundLogger: TestCluster.logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            let setting = try await client.query("SHOW statement_timeout", logger: TestCluster.logger).decode(String.self).collect()
            #expect(setting == ["1500ms"])
            let started = ContinuousClock.now
            await #expect(throws: PSQLError.self) {
                try await client.query("SELECT pg_sleep(10)", logger: TestCluster.logger).collect()
            }
            #expect(ContinuousClock.now - started < .seconds(5))
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
