import CapGate
import Foundation
import Testing

/// SPEC §9, the outbox half: the admission that brings a bounded counter to a threshold writes
/// exactly one notification row per counter, window and threshold, under any concurrency.
@Suite("Threshold notifications written by the admission", .timeLimit(.minutes(5)))
struct NotificationOutboxTests {
    static func count(_ h: Harness, _ filter: String) async throws -> Int64 {
        try await h.scalar("SELECT count(*) FROM notifications WHERE \(filter)")
    }

    @Test(
        "200 concurrent calls against a cap of 100: one 80 % and one 100 % row for the company, one per user who crossed; a refund and a new crossing add nothing; the next period notifies again"
    )
    func exactlyOncePerCrossing() async throws {
        try await HeavyTests.alone {
            try await Harness.with { h in
                try await h.createPlan("p", company: 100, user: 10)
                let (company, users) = try await h.createCompany(plan: "p", users: 20)
                // Two users send most calls (they reach their own cap of 10), the others a few each.
                let keys = Array(repeating: users[0].key, count: 10) + Array(repeating: users[1].key, count: 10) + users.map(\.key)
                let counts = try await ConcurrencyTests.burst(h, keys: keys, count: 200, gateways: [h.gatewayURL])
                #expect(counts[200] == 100)
                let c = company.text
                #expect(try await Self.count(h, "company_id = '\(c)' AND scope = 'company' AND threshold = 80") == 1)
                #expect(try await Self.count(h, "company_id = '\(c)' AND scope = 'company' AND threshold = 100") == 1)
                #expect(try await h.scalar("SELECT used FROM notifications WHERE scope = 'company' AND threshold = 80") == 80)
                #expect(try await h.scalar("SELECT limit_value FROM notifications WHERE scope = 'company' AND threshold = 100") == 100)
                // One row per user whose counter reached 8 (80 % of 10) and 10, derived from the counters.
                let at80 = try await h.scalar("SELECT count(*) FROM user_usage WHERE company_id = '\(c)' AND used >= 8")
                let at100 = try await h.scalar("SELECT count(*) FROM user_usage WHERE company_id = '\(c)' AND used >= 10")
                #expect(at80 > 0)
                #expect(try await Self.count(h, "scope = 'user' AND threshold = 80") == at80)
                #expect(try await Self.count(h, "scope = 'user' AND threshold = 100") == at100)
                #expect(
                    try await Self.count(
                        h, "scope = 'user' AND user_id NOT IN (SELECT user_id FROM user_usage WHERE used >= threshold / 10)") == 0)

                // A refund below 100 % and a new crossing: nothing new.
                let ledger = try await h.scalar("SELECT min(id) FROM usage_ledger WHERE outcome = 'charged'")
                #expect(try await h.text("SELECT capgate_refund('\(c)', \(ledger), 500, NULL)") == "true")
                let user = try #require(
                    try await h.text(
                        "SELECT user_id::text FROM user_usage WHERE company_id = '\(c)' AND used < 10 ORDER BY used DESC LIMIT 1"))
                #expect(
                    try await h.text(
                        "SELECT (capgate_charge('\(c)', '\(user)', 1, 'POST', '/v1/m', NULL, NULL, 'again', NULL, now())).decision")
                        == "charged")
                #expect(try await h.scalar("SELECT used FROM company_usage WHERE company_id = '\(c)'") == 100)
                #expect(try await Self.count(h, "scope = 'company'") == 2)

                // The next period starts over.
                try await h.exec(
                    """
                    UPDATE plan_periods SET ends_at = now() + interval '1 hour' WHERE company_id = '\(c)';
                    INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor)
                    VALUES ('\(c)', 'p', now() + interval '1 hour', now() + interval '1 month', now() + interval '1 hour')
                    """)
                for i in 0..<80 {
                    let member = users[i % 20].id.text
                    _ = try await h.text(
                        """
                        SELECT (capgate_charge('\(c)', '\(member)', 1, 'POST', '/v1/m', NULL, NULL, 'next\(i)', NULL,
                                now() + interval '2 hours')).decision
                        """)
                }
                #expect(try await Self.count(h, "scope = 'company' AND threshold = 80") == 2)
                #expect(try await Self.count(h, "scope = 'company' AND threshold = 100") == 1)
                #expect(try await Self.count(h, "status <> 'pending'") == 0)
            }
        }
    }

    @Test("feature windows notify too, on the batched path as on the single one; notifications.thresholds reach every admission")
    func featureWindowsAndThresholds() async throws {
        try await Harness.with(settings: ["notifications.thresholds": "100, 50"]) { h in
            try await h.createPlan("p", company: 1000, user: 1000)
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await FeatureAdmissionTests.seed(h, plan: "p", daily: 10, userPeriod: 4)
            #expect(try await h.text("SELECT thresholds FROM config_versions") == "{50,100}")
            let c = company.text
            let u = users[0].id.text
            // Batched: four calls in one transaction.
            let decisions = try await h.text(
                """
                SELECT string_agg(decision, ',' ORDER BY item) FROM capgate_admit_batch(
                    array_fill(''::bytea, ARRAY[4]), array_fill('\(c)'::uuid, ARRAY[4]), array_fill('\(u)'::uuid, ARRAY[4]),
                    array_fill(1, ARRAY[4]), array_fill('POST'::text, ARRAY[4]), array_fill('/v1/messages'::text, ARRAY[4]),
                    array_fill(''::text, ARRAY[4]), array_fill('analysis'::text, ARRAY[4]), ARRAY['a', 'b', 'c', 'd'],
                    array_fill(-1::bigint, ARRAY[4]), array_fill(now(), ARRAY[4]), false, array_fill(-2::bigint, ARRAY[4]),
                    array_fill(-1::bigint, ARRAY[4]), array_fill(0::smallint, ARRAY[4]), array_fill(0::bigint, ARRAY[4]))
                """)
            #expect(decisions == "charged,charged,charged,charged")
            #expect(try await Self.count(h, "feature_id = 'analysis' AND scope = 'user' AND span = 'period' AND threshold = 50") == 1)
            #expect(try await Self.count(h, "feature_id = 'analysis' AND scope = 'user' AND span = 'period' AND threshold = 100") == 1)
            #expect(try await Self.count(h, "feature_id = 'analysis' AND scope = 'company' AND span = 'day'") == 0)
            // Single: the company's day window reaches 50 % at its fifth call.
            try await h.exec("UPDATE plan_features SET user_period_limit = NULL")
            _ = try await h.text(
                "SELECT (capgate_charge('\(c)', '\(u)', 1, 'POST', '/v1/messages', NULL, 'analysis', 'e', NULL, now())).decision")
            let day = try await h.text(
                "SELECT threshold || ':' || used || '/' || limit_value FROM notifications WHERE scope = 'company' AND span = 'day'")
            #expect(day == "50:5/10")
            #expect(
                try await h.text("SELECT window_end = capgate_day_end(now(), 'UTC') FROM notifications WHERE span = 'day'") == "true")
            #expect(try await Self.count(h, "feature_id IS NULL") == 0)
        }
    }

    @Test(
        "the company's admin and the operator read its notifications newest first, paginated, with status and attempts; another company's admin gets 403; no URL configured keeps rows pending, unsent"
    )
    func readsThroughTheAPI() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 10, user: 5)
            let (a, aUsers) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            let (b, bUsers) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            for i in 0..<10 { #expect(try await h.message(key: aUsers[i % 2].key).status == 200) }
            #expect(try await h.message(key: bUsers[0].key).status == 200)
            // Company 80 and 100 %, each user 80 and 100 % (user cap 5).
            #expect(try await Self.count(h, "company_id = '\(a.text)'") == 6)
            let path = "/admin/v1/companies/\(a.text)/notifications"
            let asAdmin = [("x-api-key", aUsers[0].key)]

            let all = try await h.request(.GET, path, headers: asAdmin)
            #expect(all.status == 200)
            let items = all.json["data"]?.arrayValue ?? []
            #expect(items.count == 6)
            let times = items.compactMap { $0["created_at"]?.stringValue }
            #expect(times == times.sorted(by: >))
            let first = try #require(items.first)
            #expect(first["type"]?.stringValue == "usage.threshold")
            #expect(first["company"]?["id"]?.stringValue == a.text)
            #expect(first["status"]?.stringValue == "pending")
            #expect(first["attempts"]?.intValue == 0)
            #expect(first["last_error"] == .null)
            #expect(Set(items.compactMap { $0["threshold"]?.intValue }) == [80, 100])
            #expect(items.filter { $0["scope"]?.stringValue == "user" }.allSatisfy { $0["user"]?["email"]?.stringValue != nil })

            // Pages of 4 then 2 walk the same rows, none twice.
            let page1 = try await h.request(.GET, path + "?limit=4", headers: asAdmin).json
            #expect(page1["data"]?.arrayValue?.count == 4)
            #expect(page1["has_more"] == .bool(true))
            let cursor = try #require(page1["next_cursor"]?.stringValue)
            let page2 = try await h.request(.GET, path + "?limit=4&cursor=\(cursor)", headers: asAdmin).json
            #expect(page2["data"]?.arrayValue?.count == 2)
            #expect(page2["has_more"] == .bool(false))
            let walked = ((page1["data"]?.arrayValue ?? []) + (page2["data"]?.arrayValue ?? [])).compactMap { $0["id"]?.stringValue }
            #expect(walked == items.compactMap { $0["id"]?.stringValue })

            // The operator reads it too; a status filter; bad input is 400.
            #expect(try await h.op(.GET, path).json["data"]?.arrayValue?.count == 6)
            #expect(try await h.op(.GET, path + "?status=delivered").json["data"]?.arrayValue?.count == 0)
            #expect(try await h.op(.GET, path + "?status=sent").status == 400)
            #expect(try await h.op(.GET, path + "?cursor=1_x").status == 400)
            #expect(try await h.op(.GET, path + "?limit=0").status == 400)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(UUID().uuidString)/notifications").status == 404)

            // Company B's admin learns nothing about A; a member of A is not an admin.
            let other = try await h.request(.GET, path, headers: [("x-api-key", bUsers[0].key)])
            #expect(other.status == 403)
            #expect(!other.body.contains(a.text))
            let member = try await h.createUser(company: a)
            #expect(try await h.request(.GET, path, headers: [("x-api-key", member.key)]).status == 403)
            #expect(try await h.request(.GET, path).status == 401)
            #expect(try await h.request(.GET, "/admin/v1/companies/\(b.text)/notifications", headers: asAdmin).status == 403)
        }
    }
}
