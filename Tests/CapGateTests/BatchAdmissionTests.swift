import Foundation
import Logging
import NIOCore
import PostgresNIO
import Testing

@testable import CapGate

@Suite("Batched admission (group commit)", .timeLimit(.minutes(5)))
struct BatchAdmissionTests {
    /// Runs `body` with a ``MeteringStore`` on the harness's database, through its own pool.
    static func withMetering(
        _ h: Harness, relaxed: Bool = false, _ body: @Sendable (MeteringStore, Database) async throws -> Void
    )
        async throws
    {
        let client = PostgresClient(
            configuration: h.databaseURL.clientConfiguration(maxConnections: 4), backgroundLogger: TestCluster.logger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            let database = Database(client: client, timeout: .seconds(10), logger: TestCluster.logger)
            let metering = MeteringStore(database: database, relaxed: relaxed)
            try await body(metering, database)
            await metering.flush()
        }
    }

    static func call(
        key: String? = nil, company: UUID? = nil, user: UUID? = nil, model: String? = nil
    )
        -> AdmissionItem
    {
        AdmissionItem(
            keyHash: key.map(ApiKeyGenerator.hash),
            request: AdmissionRequest(
                companyID: company ?? UUID(), userID: user ?? UUID(), method: "POST", route: "/v1/messages", model: model,
                requestID: "req_" + UUID().uuidString
            )
        )
    }

    static func decisions(_ results: [Result<AdmissionRow, any Error>]) -> [String] {
        results.map { result in
            switch result {
            case .success(let row): row.decision?.rawValue ?? row.caller.auth.rawValue
            case .failure: "error"
            }
        }
    }

    @Test("one transaction decides every call in arrival order against the locked counters")
    func arrivalOrder() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 5, user: 3)
            let (company, users) = try await h.createCompany(plan: "p", users: 2)
            let (a, b) = (users[0], users[1])
            try await Self.withMetering(h) { _, database in
                let batch = [
                    Self.call(key: a.key),  // 1: charged (a=1, company=1)
                    Self.call(key: a.key),  // 2: charged (a=2, company=2)
                    Self.call(key: "cg_not_a_key"),  // 3: unknown key, changes nothing
                    Self.call(key: a.key),  // 4: charged (a=3, company=3)
                    Self.call(key: a.key),  // 5: a's cap of 3 is reached
                    Self.call(company: company, user: b.id),  // 6: a verified token: charged (company=4)
                    Self.call(key: b.key),  // 7: charged (company=5)
                    Self.call(key: b.key),  // 8: the company's cap of 5 is reached
                    Self.call(key: b.key),  // 9: the company's cap of 5 is reached
                    Self.call(company: company, user: UUID()),  // 10: a token for a user the company does not have
                ]
                let results = await MeteringStore.admitBatch(batch, database: database, relaxed: false)
                #expect(
                    Self.decisions(results) == [
                        "charged", "charged", "unknown_key", "charged", "user_cap", "charged", "charged", "company_cap", "company_cap",
                        "unknown_user",
                    ])
                let rows = results.compactMap { try? $0.get() }
                #expect(rows.map(\.period.companyUsed) == [1, 2, nil, 3, 3, 4, 5, 5, 5, nil])
                #expect(Set(rows.compactMap(\.ledgerID)).count == 5)
            }
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 5)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE user_id = '\(a.id.text)'") == 3)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE user_id = '\(b.id.text)'") == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 5)
        }
    }

    @Test("a call PostgreSQL rejects (NUL in a text) fails alone; the rest of its batch is admitted in order")
    func badCallFailsAlone() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 2)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Self.withMetering(h) { _, database in
                let batch = [
                    Self.call(key: key), Self.call(key: key, model: "bad\u{0}model"), Self.call(key: key), Self.call(key: key),
                ]
                let results = await MeteringStore.admitBatch(batch, database: database, relaxed: false)
                #expect(Self.decisions(results) == ["charged", "error", "charged", "user_cap"])
            }
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 2)
        }
    }

    @Test("an admission whose answer was lost after a 503: what it charged is found by request id and time and given back")
    func lateFailureGivesBack() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 2)
            let (a, b) = (users[0], users[1])
            try await Self.withMetering(h) { _, database in
                let kept = [Self.call(key: a.key), Self.call(key: a.key)]
                let late = [
                    Self.call(key: a.key), Self.call(company: company, user: b.id), Self.call(key: b.key), Self.call(key: b.key),
                ]
                let results = await MeteringStore.admitBatch(kept + late, database: database, relaxed: false)
                #expect(Self.decisions(results) == Array(repeating: "charged", count: 6))
                // The transaction committed, but as if its answer had been lost: the gateway only
                // knows the calls (plus one that never reached PostgreSQL).
                let lost = LateAdmissions(items: late + [Self.call(key: a.key)], database: database)
                let found = try await lost.findCharges()
                #expect(found.count == 4)
                await lost.giveBack(found)
                #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 2)
                let keptCharge = try results[1].get()
                #expect(
                    try await MeteringStore.refund(
                        companyID: company, ledgerID: keptCharge.ledgerID ?? 0, requestID: kept[1].request.requestID,
                        upstreamStatus: 500, database: database))
            }
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 1)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE user_id = '\(a.id.text)'") == 1)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE user_id = '\(b.id.text)'") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") == 5)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test("300 concurrent admissions queue into few transactions and stay exact (durable and relaxed)", arguments: [false, true])
    func concurrentCallsBatch(relaxed: Bool) async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 120, user: 1000)
            let (company, users) = try await h.createCompany(plan: "p", users: 6)
            try await Self.withMetering(h, relaxed: relaxed) { metering, _ in
                let admitted = try await withThrowingTaskGroup(of: Bool.self) { group in
                    for i in 0..<300 {
                        let key = users[i % users.count].key
                        group.addTask {
                            let (_, admission) = try await metering.admit(
                                key: key,
                                AdmissionRequest(companyID: UUID(), userID: UUID(), method: "POST", route: "/v1/x", requestID: "r\(i)"))
                            return admission.decision == .charged
                        }
                    }
                    var count = 0
                    for try await charged in group where charged { count += 1 }
                    return count
                }
                #expect(admitted == 120)
                let statistics = metering.admissionStatistics
                #expect(statistics.items == 300)
                #expect(statistics.largest > 1)
                #expect(statistics.batches < 300)
            }
            #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 120)
            #expect(try await h.scalar("SELECT sum(used) FROM user_usage WHERE company_id = '\(company.text)'") == 120)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 120)
        }
    }

    @Test("two gateways batching calls of eight companies into overlapping transactions: no deadlock, every cap exact")
    func overlappingBatchesNeverDeadlock() async throws {
        try await Harness.with { first in
            try await first.createPlan("p", company: 25, user: 1000)
            var keys: [String] = []
            var companies: [UUID] = []
            for _ in 0..<8 {
                let (company, users) = try await first.createCompany(plan: "p", users: 3)
                companies.append(company)
                keys += users.map(\.key)
            }
            let shuffled = keys.shuffled()
            try await Harness.with(database: first.databaseURL) { second in
                let counts = try await ConcurrencyTests.burst(
                    first, keys: shuffled, count: 480, gateways: [first.gatewayURL, second.gatewayURL])
                #expect(counts[200] == 8 * 25)
                #expect(counts[402] == 480 - 8 * 25)
            }
            for company in companies {
                #expect(try await first.scalar("SELECT used FROM company_usage WHERE company_id = '\(company.text)'") == 25)
            }
            #expect(try await first.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 8 * 25)
            let mismatches = try await CapGateRunner.verify(url: first.databaseURL, logger: TestCluster.logger)
            #expect(mismatches.isEmpty)
        }
    }

    @Test("settlements arriving a few ms apart gather into a few batches and are flushed before shutdown")
    func settlementsFlush() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.withMetering(h) { metering, _ in
                var ledgerIDs: [Int64] = []
                for i in 0..<12 {
                    let (_, admission) = try await metering.admit(
                        key: users[0].key,
                        AdmissionRequest(companyID: UUID(), userID: UUID(), method: "POST", route: "/v1/x", requestID: "s\(i)"))
                    ledgerIDs.append(try #require(admission.ledgerID))
                }
                // 3 ms apart, longer than one settlement transaction takes here: without the
                // 50 ms gathering each would find the queue idle and go alone.
                for (i, ledger) in ledgerIDs.enumerated() {
                    metering.settle(
                        companyID: company, ledgerID: ledger, upstreamStatus: 200, usage: ProviderUsage(inputTokens: Int64(i)))
                    try await Task.sleep(for: .milliseconds(3))
                }
                await metering.flush()
                #expect(
                    try await h.scalar("SELECT count(*) FROM usage_ledger WHERE settled_at IS NOT NULL AND upstream_status = 200") == 12)
                #expect(metering.settlementStatistics.items == 12)
                #expect(metering.settlementStatistics.batches <= 4, "12 without gathering")
            }
            #expect(try await h.scalar("SELECT sum(input_tokens) FROM usage_ledger") == (0..<12).reduce(0, +))
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE output_tokens IS NULL") == 12)
        }
    }
}
