import Foundation
import PostgresNIO
import Synchronization
import Testing

@testable import CapGate

/// The ledger's rollups (issue #50 item 3, migration 0028): kept by the ledger's statement
/// triggers in the transaction of every change, compacted by a job, read by the console's daily
/// chart and the per-model read, checked by `capgate verify`.
@Suite("Ledger rollups", .timeLimit(.minutes(5)))
struct LedgerRollupTests {
    static func database(_ h: Harness) -> Database { Database(client: h.db, timeout: .seconds(30), logger: TestCluster.logger) }

    /// The per-model read as it was before the rollups: straight from the ledger's charged rows.
    static func modelsFromLedger(_ h: Harness, company: UUID) async throws -> [ModelUsage] {
        let rows = try await h.db.query(
            """
            SELECT l.model, count(*)::bigint, coalesce(sum(l.input_tokens), 0)::bigint, coalesce(sum(l.output_tokens), 0)::bigint,
                   coalesce(sum(coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0)), 0)::bigint,
                   coalesce(sum(l.cache_read_tokens), 0)::bigint,
                   coalesce(sum(l.cost_micros) FILTER (WHERE l.cost_source IS NOT NULL), 0)::bigint,
                   coalesce(sum(l.hold_micros) FILTER (WHERE l.cost_source IS NULL), 0)::bigint
              FROM usage_ledger l JOIN plan_periods pp ON pp.id = l.period_id
             WHERE l.company_id = \(company) AND l.outcome = 'charged' AND pp.started_at <= now() AND pp.ends_at > now()
             GROUP BY l.model ORDER BY 7 DESC, l.model COLLATE "C" NULLS LAST
            """, logger: TestCluster.logger)
        var out: [ModelUsage] = []
        for try await r in rows.decode((String?, Int64, Int64, Int64, Int64, Int64, Int64, Int64).self) {
            out.append(
                ModelUsage(
                    model: r.0, calls: r.1, inputTokens: r.2, outputTokens: r.3, cacheWriteTokens: r.4, cacheReadTokens: r.5,
                    cost: Micros(r.6), held: Micros(r.7)))
        }
        return out
    }

    @Test(
        "under 160 concurrent calls (three models, streams, provider errors) with compactions running beside them: the rollups equal the ledger (verify), the daily chart and the per-model read equal the ledger's sums; a refund of a settled call moves them; a rollup changed by hand is a mismatch, and capgate_rollup_rebuild repairs it"
    )
    func concurrentCalls() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1_000_000, user: 1_000_000)
            let (company, users) = try await h.createCompany(plan: "p", users: 4)
            let rollups = LedgerRollups(database: Self.database(h))
            let stop = Mutex(false)
            let compactions = Task {
                var runs = 0
                while !stop.withLock({ $0 }) {
                    try await rollups.compact()
                    runs += 1
                    try await Task.sleep(for: .milliseconds(20))
                }
                return runs
            }
            let models = ["claude-a", "claude-b", "mock-error-500"]
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for i in 0..<160 {
                    group.addTask {
                        try await h.message(key: users[i % users.count].key, stream: i % 5 == 0, model: models[i % models.count]).status
                    }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses.filter { $0 == 200 }.count >= 100, "\(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
            _ = try await h.eventually(
                "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged' AND settled_at IS NULL",
                equals: 0, within: .seconds(30))
            stop.withLock { $0 = true }
            #expect(try await compactions.value > 0)

            // Verify recomputes the rollups (compacted and not) from the ledger.
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            let usage = UsageStore(database: Self.database(h))
            let charged = try await h.scalar(
                "SELECT sum(units) FROM usage_ledger WHERE company_id = '\(company.text)' AND outcome = 'charged'")
            #expect(charged > 0)
            let daily = try await usage.daily(company: company, from: nil, to: nil)
            #expect(daily.map(\.units).reduce(0, +) == charged)
            #expect(try await usage.models(company: company, period: .current)?.models == Self.modelsFromLedger(h, company: company))

            // Compacted to the last change: the same answers from usage_rollups alone.
            try await rollups.compact()
            #expect(try await h.scalar("SELECT count(*) FROM usage_rollup_changes") == 0)
            #expect(try await usage.daily(company: company, from: nil, to: nil) == daily)

            // A settled call refunded (a late give-back): the reads and the rollups follow.
            let row = try await h.db.query(
                """
                SELECT id, request_id, units::bigint FROM usage_ledger
                 WHERE company_id = \(company) AND outcome = 'charged' AND settled_at IS NOT NULL ORDER BY id LIMIT 1
                """, logger: TestCluster.logger
            ).decode((Int64, String, Int64).self).collect()
            let (ledger, requestID, units) = try #require(row.first)
            #expect(
                try await MeteringStore.refund(
                    companyID: company, ledgerID: ledger, requestID: requestID, upstreamStatus: nil, database: Self.database(h)))
            #expect(try await usage.daily(company: company, from: nil, to: nil).map(\.units).reduce(0, +) == charged - units)
            #expect(try await usage.models(company: company, period: .current)?.models == Self.modelsFromLedger(h, company: company))
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            // A rollup that disagrees with the ledger is found, with both values.
            try await rollups.compact()
            try await h.exec(
                "UPDATE usage_rollups SET units = units + 7 WHERE (company_id, bucket) = (SELECT company_id, max(bucket) FROM usage_rollups WHERE company_id = '\(company.text)' GROUP BY 1) AND model = 'claude-a'"
            )
            let mismatches = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(mismatches.count == 1, "\(mismatches)")
            #expect(mismatches.first?.measure == .rollupUnits && mismatches.first?.counter == (mismatches.first?.ledger ?? 0) + 7)
            #expect(mismatches.first?.description.contains("rollup_units") == true)
            // The repair: the rollups made again from the ledger (changes not yet compacted too).
            #expect(try await h.scalar("SELECT capgate_rollup_rebuild()") > 0)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
            #expect(try await usage.daily(company: company, from: nil, to: nil).map(\.units).reduce(0, +) == charged - units)
        }
    }

    @Test(
        "unsettled charges are counted in the rollups and found through them: /metrics' totals, the list and verify's report see the stranded ones past the grace and not the fresh one; keep and refund take them out; a rollup's count changed by hand is a mismatch that hides the charge until the rebuild"
    )
    func unsettledThroughRollups() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1_000, user: 1_000)
            let yesterday = Timestamp.format(Date().addingTimeInterval(-2 * 86_400))
            let (company, users) = try await h.createCompany(plan: "p", users: 1, startedAt: yesterday)
            let user = users[0].id
            for _ in 0..<3 { #expect(try await h.message(key: users[0].key).status == 200) }
            let oldest = try await UnsettledTests.strandedCharge(h, company: company, user: user, hoursAgo: 30)
            let older = try await UnsettledTests.strandedCharge(h, company: company, user: user, hoursAgo: 2)
            let fresh = try await UnsettledTests.strandedCharge(h, company: company, user: user, hoursAgo: 0)
            let unsettled = UnsettledCharges(database: Self.database(h))
            let rollups = LedgerRollups(database: Self.database(h))
            // Settlement is asynchronous: wait for the three calls' rows to be settled.
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE settled_at IS NOT NULL", equals: 3) == 3)
            #expect(try await h.scalar("SELECT sum(unsettled)::bigint FROM usage_rollups_all") == 3)
            try await rollups.compact()
            #expect(try await h.scalar("SELECT sum(unsettled)::bigint FROM usage_rollups_all") == 3)

            var totals = try await unsettled.totals()
            #expect(totals.count == 2)
            #expect(totals.oldestSeconds > 29 * 3600 && totals.oldestSeconds < 31 * 3600)
            #expect(try await unsettled.list(company: company).map(\.id) == [oldest, older])
            #expect(try await unsettled.list(company: UUID()).isEmpty)
            #expect(try await unsettled.totals(olderThan: 0).count == 3)
            #expect(try await unsettled.summary().map(\.count) == [2])
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            #expect(try await unsettled.keep([older]).allSatisfy(\.done))
            #expect(try await unsettled.refund([fresh], olderThan: 0).allSatisfy(\.done))
            totals = try await unsettled.totals()
            #expect(totals.count == 1)
            #expect(try await h.scalar("SELECT sum(unsettled)::bigint FROM usage_rollups_all") == 1)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)

            // The rollups are what finds them: a count zeroed by hand hides the charge, and verify
            // says so; the rebuild brings it back.
            try await rollups.compact()
            try await h.exec("UPDATE usage_rollups SET unsettled = 0 WHERE company_id = '\(company.text)'")
            #expect(try await unsettled.totals().count == 0)
            let mismatches = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(mismatches.map(\.measure) == [.rollupUnsettled], "\(mismatches)")
            #expect(mismatches.first?.counter == 0 && mismatches.first?.ledger == 1)
            #expect(try await h.scalar("SELECT capgate_rollup_rebuild()") > 0)
            #expect(try await unsettled.list(company: company).map(\.id) == [oldest])
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    @Test(
        "a zone 5:45 from UTC: the daily chart splits at that zone's midnight to the row; after a change of zone the same rows fall on that zone's days; a refunded row leaves its day"
    )
    func quarterHourZones() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1_000, user: 1_000)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            let period = try await h.scalar("SELECT max(id) FROM plan_periods WHERE company_id = '\(company.text)'")
            // Kathmandu is UTC+5:45: 2026-06-11 00:00 there is 2026-06-10 18:15 UTC.
            try await h.exec("UPDATE companies SET time_zone = 'Asia/Kathmandu' WHERE id = '\(company.text)'")
            try await h.exec(
                """
                INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature, request_id, outcome, created_at)
                VALUES ('\(company.text)', \(period), '\(users[0].id.text)', 3, 'POST', '/v1/messages', 'm', NULL, 'req_a', 'charged',
                        '2026-06-10 18:14:59.999999+00'),
                       ('\(company.text)', \(period), '\(users[0].id.text)', 5, 'POST', '/v1/messages', 'm', 'f', 'req_b', 'charged',
                        '2026-06-10 18:15:00+00'),
                       ('\(company.text)', \(period), '\(users[0].id.text)', 11, 'POST', '/v1/messages', 'm', NULL, 'req_c', 'refunded',
                        '2026-06-10 18:20:00+00')
                """)
            let usage = UsageStore(database: Self.database(h))
            let range = (UsageStore.DayBound.date("2026-06-10"), UsageStore.DayBound.date("2026-06-11"))
            #expect(
                try await usage.daily(company: company, from: range.0, to: range.1) == [
                    DailyUsage(date: "2026-06-10", units: 3, features: [:]), DailyUsage(date: "2026-06-11", units: 5, features: ["f": 5]),
                ])
            try await LedgerRollups(database: Self.database(h)).compact()
            try await h.exec("UPDATE companies SET time_zone = 'UTC' WHERE id = '\(company.text)'")
            #expect(
                try await usage.daily(company: company, from: range.0, to: range.1) == [
                    DailyUsage(date: "2026-06-10", units: 8, features: ["f": 5]), DailyUsage(date: "2026-06-11", units: 0, features: [:]),
                ])
            try await h.exec("UPDATE usage_ledger SET outcome = 'refunded' WHERE company_id = '\(company.text)' AND request_id = 'req_b'")
            #expect(
                try await usage.daily(company: company, from: range.0, to: range.1) == [
                    DailyUsage(date: "2026-06-10", units: 3, features: [:]), DailyUsage(date: "2026-06-11", units: 0, features: [:]),
                ])
            let rollups = try await BillingStore(database: Self.database(h)).rollupMismatches(h.db)
            #expect(rollups.isEmpty, "\(rollups)")
        }
    }
}
