import CapGate
import CapGateDev
import Foundation
import PostgresNIO
import Synchronization
import Testing

/// Failover the way an operator runs it: a pg_auto_failover formation (a monitor, two nodes with
/// synchronous replication, ``AutoFailoverFormation``), the gateway given the URL
/// `pg_autoctl show uri` prints, and `pg_autoctl perform failover` moving the primary back and
/// forth under load. Unlike ``FailoverTests`` (a crash and a manual promote), the old primary
/// is demoted while it still serves (a fast shutdown), so admissions in flight meet a primary
/// that stops around their commit (issue #46): a call may be forwarded only once its charge's
/// commit was acknowledged, or it is served and never charged on the node that survives; and a
/// call answered 503 must have whatever its admission may have charged given back, or it stays
/// charged there without having been served. The second test is a crash instead: the primary's
/// node killed (`kill -9` of its keeper and its PostgreSQL), and the monitor failing over by
/// itself, with nothing drained.
@Suite(
    "pg_auto_failover", .serialized, .timeLimit(.minutes(15)),
    .enabled(
        if: AutoFailoverFormation.isInstalled,
        "pg_autoctl is not installed: apt-get install -y postgresql-15-auto-failover (.ci/run installs it)")
)
struct AutoFailoverTests {
    /// One call's outcome: when it was sent and answered, and its status (0: no answer).
    struct Call: Sendable {
        var sent: ContinuousClock.Instant
        var answered: ContinuousClock.Instant
        var status: Int
        /// The answer's body when it was not a 200 (what the failure said).
        var failure: String?
        /// The gateway's `request-id` (the ledger row's `request_id`).
        var requestID: String?
    }

    /// One round's callers' outcomes, and the flag that stops them.
    final class CallLog: Sendable {
        let calls = Mutex<[Call]>([])
        let stop = Atomic<Bool>(false)
    }

    /// The status of every call of the test by its request id, for the report of a mismatch:
    /// which ledger rows belong to calls answered 200, which to calls refused.
    final class Answers: Sendable {
        let statuses = Mutex<[String: Int]>([:])

        func record(_ requestID: String?, _ status: Int) {
            guard let requestID else { return }
            statuses.withLock { $0[requestID] = status }
        }
    }

    /// What every test of the suite runs against: a formation, a gateway given the URL
    /// `pg_autoctl show uri` prints, and a company of eight users on a plan with caps no test
    /// reaches, whose first call was served.
    struct Setup: Sendable {
        let formation: AutoFailoverFormation
        let url: DatabaseURL
        let h: Harness
        let keys: [String]
        let answers: Answers
    }

    /// What a round's callers saw, and what the new primary holds afterwards.
    struct Figures {
        var statusText: String
        var served: Int64
        var servedThisRound: Int
        var charged: Int64
        /// From the first refusal after the switch began to the first success of a call sent
        /// after that refusal ("no refusal", or "never").
        var outage: String
        /// The longest stretch without a success.
        var longestGap: Duration
    }

    static let callers = 48
    static let failovers = 3
    /// Callers of the crash test: the issue's 64.
    static let crashCallers = 64

    @Test(
        "three pg_autoctl perform failover under load from 48 callers, back and forth in one formation: the gateway follows each without a restart, answers only 200 or 503, and after each every call the provider served is charged exactly once on the new primary, verify clean"
    )
    func failoversUnderLoad() async throws {
        // Three PostgreSQL instances and their keepers: they take turns with the other heavy tests.
        try await HeavyTests.alone { try await Self.failoversUnderLoadAlone() }
    }

    @Test(
        "kill -9 of the primary under load from 64 callers (its keeper, then its postmaster and the postmaster's children), the monitor failing over by itself: calls admitted again within the formation's failover time + 5 s, only 200 or 503, every call the provider served charged exactly once on the new primary, verify clean"
    )
    func crashOfThePrimary() async throws {
        try await HeavyTests.alone { try await Self.crashOfThePrimaryAlone() }
    }

    static func failoversUnderLoadAlone() async throws {
        try await withFormation { setup in
            let locator = PrimaryLocator(url: setup.url, logger: TestCluster.logger)
            var primary = try await offPool { try setup.formation.waitForPrimaryAndSecondary() }
            for round in 1...failovers {
                let newPrimary = try await Self.failoverRound(round, from: primary, setup: setup)
                #expect(newPrimary.name != primary.name, "round \(round): the primary moved")
                let expectedRoles = setup.url.hosts.map { $0.port == newPrimary.port ? PrimaryLocator.Role.writable : .readOnly }
                #expect(await locator.roles() == expectedRoles, "round \(round)")
                primary = newPrimary
            }
        }
    }

    /// Load from ``callers`` callers; `pg_autoctl perform failover` while it runs; more load; the
    /// callers stopped. Then, once the gateway has settled: served == charged on the new
    /// primary, and `capgate verify` clean through the multi-host URL. Returns the new primary.
    static func failoverRound(
        _ round: Int, from primary: AutoFailoverFormation.Instance, setup: Setup
    ) async throws -> AutoFailoverFormation.Instance {
        let log = CallLog()
        let clock = ContinuousClock()
        let servedBefore = setup.h.mock.served.count
        let (switchStarted, switchEnded, newPrimary) = try await underLoad(setup, callers: callers, log: log) {
            // Load on the primary, then the switch while the callers keep calling.
            try await Task.sleep(for: .seconds(3))
            let switchStarted = clock.now
            let newPrimary = try await offPool { try setup.formation.performFailover() }
            let switchEnded = clock.now
            // The new primary serves, through the same gateway, within 30 s of the switch.
            let firstServed = try await firstSuccess(in: log, sentAfter: switchEnded, before: switchEnded + .seconds(30))
            _ = try #require(firstServed, "round \(round): no call succeeded within 30 s of the failover")
            // More load on the new primary, then the callers stop.
            try await Task.sleep(for: .seconds(3))
            return (switchStarted, switchEnded, newPrimary)
        }
        try await checkRound(
            "round \(round)", calls: log.calls.withLock { $0 }, since: switchStarted, on: newPrimary, servedBefore: servedBefore,
            setup: setup
        ) { figures in
            "auto-failover \(round)/\(failovers): \(primary.name) → \(newPrimary.name), perform failover \(seconds(switchEnded - switchStarted)); "
                + "calls by status [\(figures.statusText)]; served \(figures.served) (\(figures.servedThisRound) this round), charged \(figures.charged); "
                + "first success after the first refusal: \(figures.outage); longest gap without a success \(seconds(figures.longestGap))"
        }
        return newPrimary
    }

    /// The primary's node killed under load from ``crashCallers`` callers (its keeper first,
    /// then its PostgreSQL: ``AutoFailoverFormation/killHard(_:)``), and the monitor left to
    /// fail over by itself, with failure detection shortened
    /// (``AutoFailoverFormation/quickFailureDetection``: a few seconds rather than about a
    /// minute with production's defaults). Unlike a `perform failover`, nothing drains the old
    /// primary: the admissions in flight lose their connection at once, whether their commit
    /// was done, waiting for the secondary, or not begun. The failover time is the formation's,
    /// from the kill until the monitor reports the other node `wait_primary` (or `primary`);
    /// within that time + 5 s a call sent after the kill must be admitted again (a 200). Then,
    /// as after a switch: only 200 or 503, served == charged on the new primary, verify clean.
    /// The killed node stays down to the end.
    static func crashOfThePrimaryAlone() async throws {
        try await withFormation(monitorSettings: AutoFailoverFormation.quickFailureDetection) { setup in
            let formation = setup.formation
            let primary = try await offPool { try formation.waitForPrimaryAndSecondary() }
            let log = CallLog()
            let clock = ContinuousClock()
            let servedBefore = setup.h.mock.served.count
            let (crash, promoted, failoverTime, firstAdmitted) = try await underLoad(setup, callers: crashCallers, log: log) {
                try await Task.sleep(for: .seconds(3))
                let crash = try await offPool { try formation.killHard(primary) }
                let promoted = try await offPool { try formation.waitForPromotion(replacing: primary) }
                let failoverTime = clock.now - crash.at
                // Waits past the bound (checked below) to tell how late a late first success was.
                let firstAdmitted = try await firstSuccess(in: log, sentAfter: crash.at, before: clock.now + .seconds(30))
                // More load on the new primary, then the callers stop.
                try await Task.sleep(for: .seconds(3))
                return (crash, promoted, failoverTime, firstAdmitted)
            }
            let admittedAfter = firstAdmitted.map { $0.answered - crash.at }
            try await checkRound(
                "crash", calls: log.calls.withLock { $0 }, since: crash.at, on: promoted, servedBefore: servedBefore, setup: setup
            ) { figures in
                "auto-failover crash: kill -9 of \(primary.name) (keeper \(crash.keeperProcesses.count) processes, PostgreSQL \(crash.postgresProcesses.count)) "
                    + "→ \(promoted.name) \(seconds(failoverTime)) after the kill; first call admitted \(admittedAfter.map(seconds) ?? "never") after the kill; "
                    + "calls by status [\(figures.statusText)]; served \(figures.served) (\(figures.servedThisRound) after the setup), charged \(figures.charged); "
                    + "first success after the first refusal: \(figures.outage); longest gap without a success \(seconds(figures.longestGap))"
            }
            #expect(promoted.name != primary.name)
            let admitted = try #require(admittedAfter, "crash: no call sent after the kill was admitted within 30 s of the promotion")
            #expect(
                admitted <= failoverTime + .seconds(5),
                "crash: first call admitted \(seconds(admitted)) after the kill; the formation failed over in \(seconds(failoverTime))")
            // The gateway's view: the new primary writable, the killed node unreachable.
            let roles = await PrimaryLocator(url: setup.url, logger: TestCluster.logger).roles()
            #expect(roles == setup.url.hosts.map { $0.port == promoted.port ? .writable : .unreachable }, "crash: \(roles)")
        }
    }

    /// Starts a formation (with `monitorSettings` on its monitor) in a folder of its own, migrates
    /// its database through the URL `pg_autoctl show uri` prints, runs a gateway on that URL
    /// (`database.timeout` 3: an admission a switch cut off is given back within ~4 s), creates
    /// the company, and runs `body`. The formation is stopped and its folder removed afterwards,
    /// whatever `body` did to its nodes.
    static func withFormation(
        monitorSettings: KeyValuePairs<String, String> = [:], _ body: @escaping @Sendable (Setup) async throws -> Void
    ) async throws {
        let logger = TestCluster.logger
        let folder = NSTemporaryDirectory() + "capgate-paf-\(UUID().uuidString)"
        // CAPGATE_TEST_KEEP_FORMATION=1 keeps the folder (the nodes' PostgreSQL logs, the keepers'
        // logs, the data) for a look after a failure; the formation is stopped either way.
        defer {
            if ProcessInfo.processInfo.environment["CAPGATE_TEST_KEEP_FORMATION"] == nil {
                try? FileManager.default.removeItem(atPath: folder)
            } else {
                print("pg_auto_failover formation kept in \(folder)")
            }
        }
        let formation = try await offPool { try AutoFailoverFormation.start(directory: folder, monitorSettings: monitorSettings) }
        defer { formation.stop() }
        let url = try await offPool { try formation.url() }
        #expect(Set(url.hosts.map(\.port)) == Set(formation.nodes.map(\.port)), "show uri names both nodes: \(url.redacted)")
        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)

        try await Harness.with(database: url, settings: ["database.timeout": "3"]) { h in
            try await h.createPlan("big", company: 100_000_000, user: 100_000_000)
            let (_, users) = try await h.createCompany(plan: "big", users: 8)
            let answers = Answers()
            let first = try await h.message(key: users[0].key)
            #expect(first.status == 200)
            answers.record(first.headers.first(name: "request-id"), first.status)
            try await body(Setup(formation: formation, url: url, h: h, keys: users.map(\.key), answers: answers))
        }
    }

    /// Runs `count` callers (each calling with one of the setup's keys, again and again; 20 ms
    /// apart after a failure), logging every call in `log` and its answer in the setup's
    /// answers, until `body` returns; then stops them and waits for their last calls.
    static func underLoad<T: Sendable>(
        _ setup: Setup, callers count: Int, log: CallLog, _ body: () async throws -> T
    ) async throws -> T {
        let clock = ContinuousClock()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            for caller in 0..<count {
                let key = setup.keys[caller % setup.keys.count]
                group.addTask {
                    while !log.stop.load(ordering: .relaxed) {
                        let sent = clock.now
                        let reply = try? await setup.h.message(key: key)
                        let status = reply?.status ?? 0
                        let call = Call(
                            sent: sent, answered: clock.now, status: status, failure: status == 200 ? nil : reply?.body ?? "no answer",
                            requestID: reply?.headers.first(name: "request-id"))
                        log.calls.withLock { $0.append(call) }
                        setup.answers.record(call.requestID, status)
                        if status != 200 { try await Task.sleep(for: .milliseconds(20)) }
                    }
                }
            }
            defer { log.stop.store(true, ordering: .relaxed) }
            let value = try await body()
            log.stop.store(true, ordering: .relaxed)
            try await group.waitForAll()
            return value
        }
    }

    /// The first call sent after `instant` and answered 200, waiting for one until `deadline`.
    static func firstSuccess(
        in log: CallLog, sentAfter instant: ContinuousClock.Instant, before deadline: ContinuousClock.Instant
    ) async throws -> Call? {
        while true {
            let found = log.calls.withLock { calls in
                calls.filter { $0.sent > instant && $0.status == 200 }.min { $0.answered < $1.answered }
            }
            if found != nil || ContinuousClock.now >= deadline { return found }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// After a round's callers stopped: prints `summary` of the round's figures, then checks
    /// what every round must hold: answers only 200 or 503, calls served, every call the provider
    /// served charged exactly once on the new primary (an admission the switch cut off is given
    /// back after database.timeout, so the count is read until it settles; a mismatch is
    /// reported row by row), and `capgate verify` clean through the multi-host URL.
    static func checkRound(
        _ label: String, calls all: [Call], since switchStarted: ContinuousClock.Instant, on newPrimary: AutoFailoverFormation.Instance,
        servedBefore: Int, setup: Setup, summary: (Figures) -> String
    ) async throws {
        let logger = TestCluster.logger
        let clock = ContinuousClock()
        let h = setup.h
        let statuses = Dictionary(grouping: all, by: \.status).mapValues(\.count)
        let statusText = statuses.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
        // The outage as the callers saw it: from the first refusal after the switch began to the
        // first success of a call sent after that refusal; and the longest stretch without a 200.
        let firstRefusal = all.filter { $0.status != 200 && $0.answered > switchStarted }.map(\.answered).min()
        let recovered = firstRefusal.flatMap { refusal in all.filter { $0.status == 200 && $0.sent > refusal }.map(\.answered).min() }
        let successes = all.filter { $0.status == 200 }.map(\.answered).sorted()
        let longestGap = zip(successes, successes.dropFirst()).map { $1 - $0 }.max() ?? .zero

        let served = Int64(h.mock.served.count)
        let endpoint = try #require(h.databaseURL.hosts.first { $0.port == newPrimary.port }, "\(label): the new primary is in the URL")
        let primaryURL = h.databaseURL.only(endpoint)
        var charged: Int64 = -1
        let deadline = clock.now + .seconds(30)
        while clock.now < deadline {
            charged = try await CapGateRunner.withClient(url: primaryURL, logger: logger) { client in
                let rows = try await client.query("SELECT count(*)::int8 FROM usage_ledger WHERE outcome = 'charged'", logger: logger)
                for try await count in rows.decode(Int64.self) { return count }
                return -1
            }
            if charged == served { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        let outage: String
        if let firstRefusal, let recovered {
            outage = seconds(recovered - firstRefusal)
        } else {
            outage = firstRefusal == nil ? "no refusal" : "never"
        }
        print(
            summary(
                Figures(
                    statusText: statusText, served: served, servedThisRound: Int(served) - servedBefore, charged: charged, outage: outage,
                    longestGap: longestGap)))

        let unexpected = all.filter { $0.status != 200 && $0.status != 503 }.prefix(5).map { "\($0.status): \($0.failure ?? "")" }
        #expect(unexpected.isEmpty, "\(label): statuses [\(statusText)]; \(unexpected)")
        #expect(Int(served) > servedBefore, "\(label): calls were served")
        var report = ""
        if charged != served { report = try await Self.mismatchReport(url: primaryURL, answers: setup.answers) }
        #expect(charged == served, "\(label): charged \(charged), served \(served); \(report)")
        // The one-shot command finds the new primary through the same multi-host URL.
        let mismatches = try await CapGateRunner.verify(url: h.databaseURL, logger: logger)
        #expect(mismatches.isEmpty, "\(label): \(mismatches)")
    }

    /// What the charged ledger rows on the primary are, against the calls' answers: rows of
    /// calls answered other than 200 (charged, never forwarded; with the transactions that
    /// wrote them, by `xmin`: one admission batch or many), calls answered 200 without a row
    /// (forwarded, never charged), request ids charged twice, rows of no call of the test.
    static func mismatchReport(url: DatabaseURL, answers: Answers) async throws -> String {
        let logger = TestCluster.logger
        let rows = try await CapGateRunner.withClient(url: url, logger: logger) { client in
            let rows = try await client.query(
                "SELECT request_id, created_at, xmin::text FROM usage_ledger WHERE outcome = 'charged'", logger: logger)
            var found: [(id: String, at: Date, transaction: String)] = []
            for try await row in rows.decode((String, Date, String).self) { found.append(row) }
            return found
        }
        let statuses = answers.statuses.withLock { $0 }
        let chargedIDs = Dictionary(grouping: rows, by: \.id)
        let refusedCharged = rows.filter { statuses[$0.id].map { $0 != 200 } ?? false }
        let unknownCharged = rows.filter { statuses[$0.id] == nil }
        let servedUncharged = statuses.filter { $0.value == 200 && chargedIDs[$0.key] == nil }.map(\.key)
        let twice = chargedIDs.filter { $0.value.count > 1 }.map(\.key)
        let byStatus = Dictionary(grouping: refusedCharged) { statuses[$0.id]! }.mapValues(\.count)
        let transactions = Dictionary(grouping: refusedCharged, by: \.transaction).map { "\($0.key): \($0.value.count)" }.sorted()
        return "charged rows of refused calls \(refusedCharged.count) (by status \(byStatus); rows by transaction \(transactions); "
            + "e.g. \(refusedCharged.prefix(3).map { "\($0.id) at \($0.at)" })), of no call seen \(unknownCharged.count), "
            + "served without a row \(servedUncharged.count) (e.g. \(servedUncharged.prefix(3))), charged twice \(twice.count)"
    }

    /// A duration for the summary line: seconds with two decimals.
    static func seconds(_ duration: Duration) -> String {
        let (whole, fraction) = duration.components
        return String(format: "%.2f s", Double(whole) + Double(fraction) / 1e18)
    }
}
