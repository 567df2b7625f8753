import Foundation
import Logging
import PostgresNIO
import Testing

@testable import CapGate

/// SPEC §14's concurrency slots as rows that calls take again (`rate_slots`, migration 0023):
/// what the upgrade carries, what the hourly purge removes, and that concurrent callers over two
/// gateways never hold more slots than the limit and add no rows past what was in flight at once.
@Suite("Rate windows: slot rows", .timeLimit(.minutes(5)))
struct RateSlotRowTests {
    @Test("migration 0023 carries the calls in flight (rate_calls with a slot, lease not over) as taken slot rows; an end frees one")
    func carry() async throws {
        let url = try await offPool { try TestCluster.shared.get().createDatabase("s_" + UUID().uuidString.prefix(8).lowercased()) }
        let logger = TestCluster.logger
        // The migrations up to 0022 (no functions), then calls as that schema held them.
        let folder = NSTemporaryDirectory() + "migrations-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let source = SDKTests.root.appendingPathComponent("db/migrations").path
        for name in try FileManager.default.contentsOfDirectory(atPath: source) where name.hasSuffix(".sql") && name < "0023" {
            try FileManager.default.copyItem(atPath: source + "/" + name, toPath: folder + "/" + name)
        }
        let old = try Migrator(folder: folder)
        let (company, user) = (UUID(), UUID())
        func run(_ sql: String) async throws -> [Int64] {
            try await CapGateRunner.withClient(url: url, logger: logger) { client in
                try await client.query(PostgresQuery(unsafeSQL: sql), logger: logger).decode(Int64.self).collect()
            }
        }
        _ = try await CapGateRunner.withClient(url: url, logger: logger) { try await old.migrate(client: $0, logger: logger) }
        // 11: in flight; 12: in flight, of a feature; 13: lease over (a dead gateway's); 14: no slot.
        _ = try await run(
            """
            WITH i AS (
                INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
                VALUES ('\(company.text)', 11, '\(user.text)', '', now(), 5, 5, now() + interval '10 minutes'),
                       ('\(company.text)', 12, '\(user.text)', 'f', now(), 5, 4, now() + interval '10 minutes'),
                       ('\(company.text)', 13, '\(user.text)', '', now(), 5, 4, now() - interval '1 minute'),
                       ('\(company.text)', 14, '\(user.text)', '', now(), 5, 1, now() + interval '10 minutes')
                RETURNING 1)
            SELECT count(*) FROM i
            """)

        _ = try await CapGateRunner.migrate(url: url, dryRun: false, logger: logger)
        #expect(try await run("SELECT (to_regclass('rate_calls') IS NULL)::int::int8") == [1])
        #expect(
            try await run(
                "SELECT slot * 10 + CASE WHEN feature_id = 'f' THEN 1 ELSE 0 END FROM rate_slots WHERE ledger_id = slot ORDER BY slot")
                == [110, 121])
        #expect(try await run("SELECT count(*) FROM rate_slots") == [2])
        // The end of call 11 (as the gateway writes it) frees its row, which stays to be taken again.
        _ = try await run(
            "SELECT 0::int8 FROM capgate_rate_end(ARRAY['\(company.text)'::uuid], ARRAY['\(user.text)'::uuid], ARRAY[11::int8])")
        #expect(try await run("SELECT count(*) FROM rate_slots WHERE ledger_id IS NULL") == [1])
        #expect(try await run("SELECT count(*) FROM rate_slots") == [2])
    }

    @Test("the hourly purge removes slot rows no call took for an hour past their lease, and keeps the others")
    func purge() async throws {
        try await Harness.with { h in
            let (company, users) = try await h.createCompany(plan: nil, users: 1)
            let user = users[0].id.text
            try await h.exec(
                """
                INSERT INTO rate_slots (company_id, user_id, slot, ledger_id, feature_id, lease_until)
                VALUES ('\(company.text)', '\(user)', 1, NULL, '', now() - interval '2 hours'),
                       ('\(company.text)', '\(user)', 2, 7, '', now() - interval '2 hours'),
                       ('\(company.text)', '\(user)', 3, NULL, '', now() - interval '30 minutes'),
                       ('\(company.text)', '\(user)', 4, 8, '', now() + interval '5 minutes')
                """)
            try await BatchAdmissionTests.withMetering(h) { metering, _ in
                try await metering.purgeRateSlots()
            }
            #expect(try await h.text("SELECT string_agg(slot::text, ',' ORDER BY slot) FROM rate_slots") == "3,4")
        }
    }

    @Test("user_concurrency 2, 24 callers of one user over two gateways, streams: never more than 2 slots taken, never more than 2 rows")
    func concurrentCallers() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_concurrency": 2]))
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Harness.with(database: h.databaseURL) { second in
                let taken = "SELECT count(*) FROM rate_slots WHERE ledger_id IS NOT NULL AND lease_until > now()"
                let results = try await withThrowingTaskGroup(of: (Int, Int64).self) { group in
                    for index in 0..<24 {
                        group.addTask {
                            let base = index % 2 == 0 ? h.gatewayURL : second.gatewayURL
                            for _ in 0..<3 {
                                let status = try await h.message(key: key, stream: index % 3 == 0, base: base).status
                                let now = try await h.scalar(taken)
                                if status != 429 { return (status, now) }
                                try await Task.sleep(for: .milliseconds(Int.random(in: 5...40)))
                            }
                            return (429, try await h.scalar(taken))
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(results.allSatisfy { $0.0 == 200 || $0.0 == 429 }, "\(results.map(\.0))")
                #expect(results.contains { $0.0 == 200 } && results.contains { $0.0 == 429 })
                #expect(results.allSatisfy { $0.1 <= 2 }, "slots taken seen: \(results.map(\.1))")
                #expect(try await h.eventually(taken, equals: 0) == 0)
                #expect(try await h.scalar("SELECT count(*) FROM rate_slots") <= 2)
                // Every admitted call took a slot: as many charged calls as 200s.
                let admitted = Int64(results.filter { $0.0 == 200 }.count)
                #expect(
                    try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged' AND rate_scopes & 4 <> 0") == admitted)
            }
        }
    }
}
