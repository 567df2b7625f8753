import CapGate
import Foundation
import Testing

/// SPEC §11 "Headers and reads": the cost objects of the usage reads and the history, the ledger's
/// token and cost columns, and the per-model read. Admission does not price calls yet, so the
/// calls make the rows and the test writes the money into them.
@Suite("Cost in the usage reads", .timeLimit(.minutes(5)))
struct CostReadTests {
    /// Waits until the gateway has written the answers of every call of `company` (tokens and
    /// settlement are written in batches after each answer), so what the test writes stays.
    static func settled(_ h: Harness, _ company: UUID) async throws {
        let open = try await h.eventually(
            "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND settled_at IS NULL", equals: 0)
        try #require(open == 0, "\(open) calls not settled")
    }

    @Test(
        "GET /v1/usage and the admin read: exact decimal strings, the user's budget over the plan's, remaining never below 0, null when unlimited"
    )
    func usageReads() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 1000, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 3, role: "admin")
            for user in users[1...] { #expect(try await h.message(key: user.key).status == 200) }
            try await h.exec(
                """
                UPDATE plans SET monthly_company_budget = 10000000, monthly_user_budget = 2000000 WHERE id = 'p';
                UPDATE users SET monthly_budget = 500000 WHERE id = '\(users[2].id.text)';
                UPDATE company_usage SET cost_used = 1834567, cost_held = 250000 WHERE company_id = '\(company.text)';
                UPDATE user_usage SET cost_used = 1234567 WHERE user_id = '\(users[1].id.text)';
                UPDATE user_usage SET cost_used = 600000, cost_held = 250000 WHERE user_id = '\(users[2].id.text)';
                """)
            let companyCost = #"{"held":"0.25","limit":"10","remaining":"7.915433","used":"1.834567"}"#
            let one = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[1].key)])
            #expect(one.status == 200)
            #expect(
                one.body.contains(
                    #""cost":{"company":\#(companyCost),"user":{"held":"0","limit":"2","remaining":"0.765433","used":"1.234567"}}"#),
                "\(one.body)")
            // Its own budget of 0.5 is under what it spent and holds: nothing remains, not a debt.
            let two = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[2].key)])
            #expect(two.body.contains(#""user":{"held":"0.25","limit":"0.5","remaining":"0","used":"0.6"}"#), "\(two.body)")
            // A user with no counter yet: nothing used, the plan's whole per-user budget left.
            let admin = [("x-api-key", users[0].key)]
            let zero = try await h.request(.GET, "/v1/usage", headers: admin)
            #expect(zero.body.contains(#""user":{"held":"0","limit":"2","remaining":"2","used":"0"}"#), "\(zero.body)")

            // The admin read: the company's at the top and in `usage` (no `user`), each user's in `users`.
            let read = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: admin)
            #expect(read.status == 200)
            #expect(read.json["cost"]?.serialized() == #"{"company":\#(companyCost)}"#, "\(read.body)")
            #expect(read.json["usage"]?["cost"] == read.json["cost"])
            let entries = read.json["users"]?.arrayValue ?? []
            func cost(_ id: UUID) -> String? { entries.first { $0["id"]?.stringValue == id.text }?["cost"]?.serialized() }
            #expect(cost(users[0].id) == #"{"held":"0","limit":"2","remaining":"2","used":"0"}"#)
            #expect(cost(users[1].id) == #"{"held":"0","limit":"2","remaining":"0.765433","used":"1.234567"}"#)
            #expect(cost(users[2].id) == #"{"held":"0.25","limit":"0.5","remaining":"0","used":"0.6"}"#)

            // Unlimited budgets: `limit` and `remaining` null, what was spent still shown.
            try await h.exec(
                """
                UPDATE plans SET monthly_company_budget = NULL, monthly_user_budget = NULL WHERE id = 'p';
                UPDATE users SET monthly_budget = NULL WHERE id = '\(users[2].id.text)';
                """)
            let unlimited = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[2].key)])
            #expect(
                unlimited.body.contains(
                    #""cost":{"company":{"held":"0.25","limit":null,"remaining":null,"used":"1.834567"},"#
                        + #""user":{"held":"0.25","limit":null,"remaining":null,"used":"0.6"}}"#), "\(unlimited.body)")
            let adminUnlimited = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: admin)
            #expect(
                adminUnlimited.json["users"]?.arrayValue?.allSatisfy { $0["cost"]?["limit"]?.isNull == true } == true,
                "\(adminUnlimited.body)")
            // A user's own budget applies under an unlimited plan.
            try await h.exec("UPDATE users SET monthly_budget = 3000000 WHERE id = '\(users[1].id.text)'")
            let own = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[1].key)])
            #expect(own.body.contains(#""user":{"held":"0","limit":"3","remaining":"1.765433","used":"1.234567"}"#), "\(own.body)")
        }
    }

    @Test(
        "end to end: priced calls' real costs and holds in /v1/usage, its cost RateLimit fields, the admin read, events and the per-model read"
    )
    func endToEnd() async throws {
        try await Harness.with { h in
            try await h.createBudgetPlan("p", company: 1000, user: 1000, companyBudget: 5_000_000, userBudget: 1_000_000)
            let (company, users) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            for (i, user) in users.enumerated() {
                for _ in 0...i { #expect(try await h.message(key: user.key).status == 200) }
            }
            try #require(
                try await h.eventually(
                    "SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)' AND cost_source = 'usage'", equals: 3) == 3)
            let spent = try await h.scalar("SELECT sum(cost_micros) FROM usage_ledger WHERE company_id = '\(company.text)'")
            let second = try await h.scalar("SELECT sum(cost_micros) FROM usage_ledger WHERE user_id = '\(users[1].id.text)'")
            #expect(spent > 0 && second > 0 && second < spent)

            let read = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[1].key)])
            #expect(read.json["cost"]?["company"]?["used"]?.stringValue == Micros(spent).decimal, "\(read.body)")
            #expect(read.json["cost"]?["company"]?["remaining"]?.stringValue == Micros(5_000_000 - spent).decimal)
            #expect(read.json["cost"]?["user"]?["used"]?.stringValue == Micros(second).decimal)
            #expect(read.json["cost"]?["user"]?["held"]?.stringValue == "0")
            // The RateLimit fields carry both budgets in micro-dollars, as the proxy's answers do.
            let policy = read.headers.first(name: "ratelimit-policy") ?? ""
            let state = read.headers.first(name: "ratelimit") ?? ""
            #expect(policy.contains(#""company-cost";q=5000000"#) && policy.contains(#""user-cost";q=1000000"#), "\(policy)")
            #expect(state.contains(#""company-cost";r=\#(5_000_000 - spent);"#), "\(state)")
            #expect(state.contains(#""user-cost";r=\#(1_000_000 - second);"#), "\(state)")

            let admin = [("x-api-key", users[0].key)]
            let usage = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: admin)
            #expect(usage.json["cost"]?["company"]?["used"]?.stringValue == Micros(spent).decimal)
            let mine = usage.json["users"]?.arrayValue?.first { $0["id"]?.stringValue == users[1].id.text }
            #expect(mine?["cost"]?["used"]?.stringValue == Micros(second).decimal)
            let events =
                try await h.request(.GET, "/admin/v1/companies/\(company.text)/events", headers: admin).json["data"]?.arrayValue ?? []
            #expect(events.count == 3 && events.allSatisfy { $0["cost_source"]?.stringValue == "usage" && $0["hold_usd"]?.isNull == false })
            let models = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage/models", headers: admin).json
            #expect(models["models"]?.arrayValue?.count == 1)
            let model = models["models"]?.arrayValue?.first
            #expect(model?["model"]?.stringValue == "claude-test")
            #expect(model?["calls"]?.intValue == 3)
            #expect(model?["cost_usd"]?.stringValue == Micros(spent).decimal)
            #expect(model?["held_usd"]?.stringValue == "0")
        }
    }

    @Test("history: each past period's cost against the plan's company budget")
    func history() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 10, user: 5)
            let (company, users) = try await h.createCompany(plan: "p", users: 1, role: "admin", startedAt: "2026-01-10T00:00:00Z")
            try await h.exec(
                """
                UPDATE plans SET monthly_company_budget = 1000000 WHERE id = 'p';
                INSERT INTO company_usage (company_id, period_id, used, cost_used, cost_held)
                SELECT company_id, id, 3, 1234567, 5 FROM plan_periods WHERE company_id = '\(company.text)'
                ON CONFLICT (company_id, period_id) DO UPDATE SET used = 3, cost_used = 1234567, cost_held = 5;
                """)
            _ = try await BillingTests.rollover(h, at: Timestamp.format(Date()))
            let history = try await h.request(
                .GET, "/admin/v1/companies/\(company.text)/usage/history?periods=120", headers: [("x-api-key", users[0].key)])
            let entries = history.json["data"]?.arrayValue ?? []
            let first = try #require(entries.last, "\(history.body)")
            #expect(first["period"]?["start"]?.stringValue == "2026-01-10T00:00:00Z")
            // Over the budget (a provider billed past the holds): nothing remains.
            #expect(
                first["cost"]?.serialized() == #"{"company":{"held":"0.000005","limit":"1","remaining":"0","used":"1.234567"}}"#,
                "\(history.body)")
            // Later periods: nothing spent; with ?feature= the cost is still the company's.
            if entries.count > 1 {
                #expect(entries[0]["cost"]?.serialized() == #"{"company":{"held":"0","limit":"1","remaining":"1","used":"0"}}"#)
            }
            let feature = try await h.op(.GET, "/admin/v1/companies/\(company.text)/usage/history?periods=120&feature=none")
            #expect(feature.json["data"]?.arrayValue?.last?["cost"] == first["cost"])
        }
    }

    @Test("events: tokens, hold, cost and its source in JSON and at the end of the CSV; null and empty where absent")
    func events() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            for _ in 0..<3 { #expect(try await h.message(key: users[0].key).status == 200) }
            try await Self.settled(h, company)
            try await h.exec(
                """
                WITH r AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM usage_ledger WHERE company_id = '\(company.text)')
                UPDATE usage_ledger l SET
                    cache_write_5m_tokens = CASE r.n WHEN 1 THEN 100 WHEN 2 THEN 40 END,
                    cache_write_1h_tokens = CASE r.n WHEN 1 THEN 20 END,
                    cache_read_tokens = CASE r.n WHEN 1 THEN 30 END,
                    hold_micros = CASE r.n WHEN 1 THEN 2000000 WHEN 2 THEN 1500 END,
                    cost_micros = CASE r.n WHEN 1 THEN 1234567 END,
                    cost_source = CASE r.n WHEN 1 THEN 'usage' END
                  FROM r WHERE l.company_id = '\(company.text)' AND l.id = r.id
                """)
            let admin = [("x-api-key", users[0].key)]
            let rows =
                try await h.request(.GET, "/admin/v1/companies/\(company.text)/events", headers: admin).json["data"]?.arrayValue ?? []
            try #require(rows.count == 3)
            func fields(_ row: JSON) -> [String] {
                ["cache_write_tokens", "cache_read_tokens", "hold_usd", "cost_usd", "cost_source"].map {
                    row[$0]?.serialized() ?? "missing"
                }
            }
            #expect(fields(rows[0]) == ["120", "30", #""2""#, #""1.234567""#, #""usage""#])
            #expect(fields(rows[1]) == ["40", "null", #""0.0015""#, "null", "null"])
            #expect(fields(rows[2]) == ["null", "null", "null", "null", "null"])
            #expect(rows[0]["model"]?.stringValue == "claude-test" && rows[0]["input_tokens"]?.intValue ?? 0 > 0)

            let csv = try await h.request(.GET, "/admin/v1/companies/\(company.text)/events", headers: admin + [("accept", "text/csv")])
            let lines = csv.body.split(separator: "\n", omittingEmptySubsequences: false)
            #expect(
                lines.first.map(String.init)
                    == "id,time,user_id,units,input_tokens,output_tokens,method,route,model,outcome,upstream_status,request_id,"
                    + "company_id,period_start,period_end,feature,idempotency_key,settlement,"
                    + "cache_write_tokens,cache_read_tokens,hold_usd,cost_usd,cost_source")
            #expect(lines.count == 5 && lines[4].isEmpty)
            #expect(lines[1].hasSuffix(",settled,120,30,2,1.234567,usage"), "\(lines[1])")
            #expect(lines[2].hasSuffix(",settled,40,,0.0015,,"), "\(lines[2])")
            #expect(lines[3].hasSuffix(",settled,,,,,"), "\(lines[3])")
            #expect(lines[1].split(separator: ",", omittingEmptySubsequences: false).count == 23)
        }
    }

    @Test("usage/models: charged calls per model, cost desc then model, settled cost and open holds apart; period by its start date")
    func models() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 2, role: "admin")
            let (other, otherUsers) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            for i in 0..<7 { #expect(try await h.message(key: users[i % 2].key).status == 200) }
            #expect(try await h.message(key: otherUsers[0].key).status == 200)
            try await Self.settled(h, company)
            try await Self.settled(h, other)
            // Rows 1-2 one model (settled), 3-4 another (one settled, one still held), 5 a third whose
            // cost ties with the second's, 6 refunded (not counted), 7 named no model.
            try await h.exec(
                """
                WITH r AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM usage_ledger WHERE company_id = '\(company.text)')
                UPDATE usage_ledger l SET
                    model = CASE WHEN r.n IN (1, 2) THEN 'claude-sonnet-4-5' WHEN r.n IN (3, 4) THEN 'claude-haiku-4-5'
                                 WHEN r.n = 5 THEN 'claude-a' WHEN r.n = 6 THEN 'claude-opus-4-1' END,
                    input_tokens = 10 * r.n, output_tokens = r.n,
                    cache_write_5m_tokens = CASE WHEN r.n = 1 THEN 5 END, cache_write_1h_tokens = CASE WHEN r.n IN (1, 2) THEN 7 END,
                    cache_read_tokens = CASE WHEN r.n = 3 THEN 9 END,
                    hold_micros = CASE WHEN r.n = 4 THEN 700000 ELSE 2000000 END,
                    cost_micros = CASE WHEN r.n IN (1, 2) THEN 1000000 WHEN r.n IN (3, 5) THEN 300000 WHEN r.n = 6 THEN 9000000 END,
                    cost_source = CASE WHEN r.n IN (1, 2, 3, 5, 6) THEN 'usage' END,
                    outcome = CASE WHEN r.n = 6 THEN 'refunded' ELSE outcome END
                  FROM r WHERE l.company_id = '\(company.text)' AND l.id = r.id;
                UPDATE usage_ledger SET cost_micros = 50000000, cost_source = 'usage' WHERE company_id = '\(other.text)';
                """)
            let admin = [("x-api-key", users[0].key)]
            let path = "/admin/v1/companies/\(company.text)/usage/models"
            let read = try await h.request(.GET, path, headers: admin)
            #expect(read.status == 200)
            let usage = try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: admin).json
            let period = try #require(usage["usage"]?["period"])
            #expect(read.json["period"] == period)
            let models =
                #"[{"cache_read_tokens":0,"cache_write_tokens":19,"calls":2,"cost_usd":"2","held_usd":"0","input_tokens":30,"#
                + #""model":"claude-sonnet-4-5","output_tokens":3},"#
                + #"{"cache_read_tokens":0,"cache_write_tokens":0,"calls":1,"cost_usd":"0.3","held_usd":"0","input_tokens":50,"#
                + #""model":"claude-a","output_tokens":5},"#
                + #"{"cache_read_tokens":9,"cache_write_tokens":0,"calls":2,"cost_usd":"0.3","held_usd":"0.7","input_tokens":70,"#
                + #""model":"claude-haiku-4-5","output_tokens":7},"#
                + #"{"cache_read_tokens":0,"cache_write_tokens":0,"calls":1,"cost_usd":"0","held_usd":"2","input_tokens":70,"#
                + #""model":null,"output_tokens":7}]"#
            #expect(read.json["models"]?.serialized() == models, "\(read.body)")

            // The same period by its start date; the operator too.
            let start = try #require(period["start"]?.stringValue)
            let byDate = try await h.op(.GET, path + "?period=\(start.prefix(10))")
            #expect(byDate.status == 200)
            #expect(byDate.body == read.body)
            // A day no period starts on: 404; not a date: 400 in the error envelope.
            let dayBefore = Timestamp.format(Timestamp.parse(start)!.addingTimeInterval(-86400)).prefix(10)
            let none = try await h.op(.GET, path + "?period=\(dayBefore)")
            #expect(none.status == 404 && none.json["error"]?["type"]?.stringValue == "not_found_error", "\(none.body)")
            for bad in ["2026-1-10", "2026-02-30", "yesterday", "", "2026-01-10T00:00:00Z", "20260110"] {
                let reply = try await h.op(.GET, path + "?period=\(bad)")
                #expect(reply.status == 400, "\(bad): \(reply.status)")
                #expect(reply.json["type"]?.stringValue == "error")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error", "\(bad)")
            }
            // Another company's admin and a member: 403, learning nothing (as for a company that does not exist).
            let foreign = try await h.request(.GET, path, headers: [("x-api-key", otherUsers[0].key)])
            #expect(foreign.status == 403 && !foreign.body.contains("claude"))
            let missing = try await h.request(
                .GET, "/admin/v1/companies/\(UUID().text)/usage/models", headers: [("x-api-key", otherUsers[0].key)])
            #expect(missing.body == foreign.body)
            #expect(try await h.request(.GET, path + "?period=bad", headers: [("x-api-key", otherUsers[0].key)]).status == 403)
            #expect(try await h.request(.GET, path, headers: [("x-api-key", users[1].key)]).status == 403)
            #expect(try await h.request(.GET, path).status == 401)
            #expect(try await h.op(.GET, "/admin/v1/companies/\(UUID().text)/usage/models").status == 404)
            // The other company sees only its own.
            let theirs = try await h.request(
                .GET, "/admin/v1/companies/\(other.text)/usage/models", headers: [("x-api-key", otherUsers[0].key)])
            #expect(theirs.json["models"]?.arrayValue?.map { $0["cost_usd"]?.stringValue } == ["50"], "\(theirs.body)")
        }
    }

    @Test("usage/models: a past period by its start date, and no current period when the company has no plan")
    func pastAndNoPlan() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "p", users: 1, role: "admin", startedAt: "2026-01-10T00:00:00Z")
            #expect(try await h.message(key: users[0].key).status == 200)
            try await Self.settled(h, company)
            // The call moved the company into the current period; put its row in January's.
            try await h.exec(
                """
                UPDATE usage_ledger l SET period_id = pp.id, created_at = timestamptz '2026-01-15 12:00:00+00',
                       model = 'claude-old', cost_micros = 42, cost_source = 'hold'
                  FROM plan_periods pp
                 WHERE pp.company_id = l.company_id AND pp.started_at = timestamptz '2026-01-10 00:00:00+00'
                   AND l.company_id = '\(company.text)'
                """)
            let path = "/admin/v1/companies/\(company.text)/usage/models"
            let january = try await h.op(.GET, path + "?period=2026-01-10")
            #expect(january.status == 200)
            #expect(
                january.body
                    == #"{"models":[{"cache_read_tokens":0,"cache_write_tokens":0,"calls":1,"cost_usd":"0.000042","held_usd":"0","#
                    + #""input_tokens":\#(january.json["models"]?.arrayValue?.first?["input_tokens"]?.intValue ?? -1),"#
                    + #""model":"claude-old","output_tokens":7}],"period":{"end":"2026-02-10T00:00:00Z","start":"2026-01-10T00:00:00Z"}}"#,
                "\(january.body)")
            #expect(try await h.op(.GET, path).json["models"]?.arrayValue?.isEmpty == true)
            #expect(try await h.op(.GET, path + "?period=2026-01-11").status == 404)

            let (planless, _) = try await h.createCompany(plan: nil, users: 1)
            let none = try await h.op(.GET, "/admin/v1/companies/\(planless.text)/usage/models")
            #expect(none.status == 404 && none.json["error"]?["type"]?.stringValue == "not_found_error", "\(none.body)")
        }
    }
}
