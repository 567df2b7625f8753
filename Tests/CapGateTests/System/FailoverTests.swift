import CapGate
import CapGateDev
import Foundation
import PostgresNIO
import Synchronization
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// PostgreSQL failover with real processes: a primary with a synchronous standby
/// (``EmbeddedReplicaSet``), a gateway given both hosts in one `database.url`.
@Suite("PostgreSQL failover", .serialized, .timeLimit(.minutes(5)))
struct FailoverTests {
    /// A replica set of the test's own under a temporary folder, migrated through its
    /// multi-host URL; stopped and removed at the end.
    static func withReplicaSet(_ body: (EmbeddedReplicaSet) async throws -> Void) async throws {
        let folder = NSTemporaryDirectory() + "capgate-failover-\(UUID().uuidString)"
        let set = try await offPool {
            try EmbeddedReplicaSet.start(directory: folder, settings: ["fsync": "off"], logger: TestCluster.logger)
        }
        defer {
            set.standby.stop()
            // A postmaster the test killed is not stopped again (its pid may be another's by now).
            if let pid = set.primary.postmasterPID, kill(pid, 0) == 0 { set.primary.stop() }
            try? FileManager.default.removeItem(atPath: folder)
        }
        _ = try await CapGateRunner.migrate(url: set.url, dryRun: false, logger: TestCluster.logger)
        try await body(set)
    }

    /// One call's outcome: when it was sent and answered, and its status (0: no answer).
    struct Call: Sendable {
        var sent: ContinuousClock.Instant
        var answered: ContinuousClock.Instant
        var status: Int
        /// The answer's body when it was not a 200 (what the failure said).
        var failure: String?
    }

    /// The callers' outcomes, and the flag that stops them.
    final class CallLog: Sendable {
        let calls = Mutex<[Call]>([])
        let stop = Atomic<Bool>(false)
    }

    @Test(
        "failover under load: 32 callers, kill -9 of the primary, pg_ctl promote of the standby; calls succeed again within 10 s without a restart, 503 only in the gap, every served call charged exactly once, verify clean"
    )
    func failoverUnderLoad() async throws {
        // A primary with a standby per test: two set up at once on a cold, loaded machine once
        // kept a standby from streaming within 60 s, so they take turns with the heavy tests.
        try await HeavyTests.alone { try await Self.failoverUnderLoadAlone() }
    }

    static func failoverUnderLoadAlone() async throws {
        try await Self.withReplicaSet { set in
            let logger = TestCluster.logger
            let locator = PrimaryLocator(url: set.url, logger: logger)
            #expect(await locator.roles() == [.writable, .readOnly])

            try await Harness.with(database: set.url, settings: ["database.timeout": "3"]) { h in
                try await h.createPlan("big", company: 100_000_000, user: 100_000_000)
                let (_, users) = try await h.createCompany(plan: "big", users: 8)
                #expect(try await h.message(key: users[0].key).status == 200)

                let log = CallLog()
                let clock = ContinuousClock()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for caller in 0..<32 {
                        let key = users[caller % users.count].key
                        group.addTask {
                            while !log.stop.load(ordering: .relaxed) {
                                let sent = clock.now
                                let reply = try? await h.message(key: key)
                                let status = reply?.status ?? 0
                                let call = Call(
                                    sent: sent, answered: clock.now, status: status,
                                    failure: status == 200 ? nil : reply?.body ?? "no answer")
                                log.calls.withLock { $0.append(call) }
                                if status != 200 { try await Task.sleep(for: .milliseconds(20)) }
                            }
                        }
                    }
                    // Load on the primary, then its postmaster killed as in a crash.
                    try await Task.sleep(for: .seconds(2))
                    let servedBeforeKill = h.mock.served.count
                    // Taken before the signal: a caller may see the crash before this line runs.
                    let killed = clock.now
                    set.primary.killPostmaster()
                    try await Task.sleep(for: .seconds(2))
                    #expect(await locator.roles() == [.unreachable, .readOnly])
                    try await offPool { try set.standby.promote() }
                    let promoted = clock.now
                    // Calls succeed again, through the same gateway, within 10 s of the promotion.
                    var recovered: ContinuousClock.Instant? = nil
                    while recovered == nil && clock.now < promoted + .seconds(10) {
                        recovered = log.calls.withLock { $0.filter { $0.sent > promoted && $0.status == 200 }.map(\.answered).min() }
                        if recovered == nil { try await Task.sleep(for: .milliseconds(50)) }
                    }
                    let recoveredAt = try #require(recovered, "no call succeeded within 10 s of the promotion")
                    // More load on the new primary, then the callers stop.
                    try await Task.sleep(for: .seconds(2))
                    log.stop.store(true, ordering: .relaxed)
                    try await group.waitForAll()

                    let all = log.calls.withLock { $0 }
                    let statuses = Dictionary(grouping: all, by: \.status).mapValues(\.count)
                    let recoveryTime = recoveredAt - promoted
                    print(
                        "failover: calls by status \(statuses); served before kill \(servedBeforeKill); first success \(recoveryTime) after promote"
                    )
                    #expect(recoveryTime < .seconds(10))
                    #expect(h.mock.served.count > servedBeforeKill, "calls were served after the failover")
                    // Every call was answered, 200 or (in the gap only) 503.
                    let unexpected = all.filter { $0.status != 200 && $0.status != 503 }.prefix(5).map {
                        "\($0.status): \($0.failure ?? "")"
                    }
                    #expect(unexpected.isEmpty, "statuses: \(statuses); \(unexpected)")
                    #expect(all.contains { $0.status == 503 }, "the gap refused calls")
                    let lateFailures = all.filter { $0.status != 200 && $0.sent > recoveredAt + .seconds(1) }
                    #expect(lateFailures.isEmpty, "\(lateFailures.count) calls failed after the gateway had recovered")
                    let earlyFailures = all.filter { $0.status != 200 && $0.answered < killed }
                    #expect(earlyFailures.isEmpty, "\(earlyFailures.count) calls failed before the kill")
                }

                // On the new primary: every call the provider served is charged exactly once. An
                // admission cut off by the kill is given back by the gateway after
                // database.timeout, so the count is read until it settles.
                let served = Int64(h.mock.served.count)
                let standbyURL = set.url.only(set.url.hosts[1])
                var charged: Int64 = -1
                let deadline = ContinuousClock.now + .seconds(30)
                while ContinuousClock.now < deadline {
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
            #expect(await locator.roles() == [.unreachable, .writable])
            // The one-shot commands find the new primary through the same multi-host URL.
            let mismatches = try await CapGateRunner.verify(url: set.url, logger: logger)
            #expect(mismatches.isEmpty, "\(mismatches)")
        }
    }
}
