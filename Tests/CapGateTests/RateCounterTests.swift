import CapGate
import Foundation
import Testing

/// SPEC §14: the plan's minute windows live in the period counter rows (company_usage,
/// user_usage). A new period inside a minute must not open a second window, and what a call gives
/// back must be what it put there.
@Suite("Rate windows in the period counters", .timeLimit(.minutes(5)))
struct RateCounterTests {
    @Test("a plan change inside a minute opens no second window: the new period carries the minute's counts, on both admission paths")
    func planChangeCarries() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await h.createPlan("q", company: nil, user: nil)
            for plan in ["p", "q"] { try await RateWindowTests.setLimits(h, plan: plan, .obj(["company_rpm": 5, "user_rpm": 3])) }
            let (company, users) = try await h.createCompany(plan: "p", users: 2)
            try await RateWindowTests.roomInMinute(30)
            // Two calls in the first period (the batched path: no Idempotency-Key).
            for _ in 0..<2 { #expect(try await h.message(key: users[0].key).status == 200) }
            #expect(try await h.op(.PUT, "/admin/v1/companies/\(company.text)/plan", .obj(["plan": "q"])).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM plan_periods WHERE company_id = '\(company.text)'") == 2)

            // The user had 2 of 3: one more, then 429, though the new period's rows started empty.
            #expect(try await h.message(key: users[0].key).status == 200)
            let refused = try await h.message(key: users[0].key)
            #expect(refused.status == 429)
            #expect(refused.json["usage"]?["rate"]?["window"]?.stringValue == "user-rpm")
            #expect(refused.json["usage"]?["rate"]?["used"]?.intValue == 3)
            let usage = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", users[0].key)]).json
            let userWindow = usage["rate"]?.arrayValue?.first { $0["window"]?.stringValue == "user-rpm" }
            #expect(userWindow?["used"]?.intValue == 3)

            // The company had 3 of 5: the other user's calls on the single path (Idempotency-Key) see it.
            let idempotent = { (n: Int) in [("idempotency-key", "carry-\(n)")] }
            #expect(try await h.message(key: users[1].key, headers: idempotent(1)).status == 200)
            #expect(try await h.message(key: users[1].key, headers: idempotent(2)).status == 200)
            let company429 = try await h.message(key: users[1].key, headers: idempotent(3))
            #expect(company429.status == 429)
            #expect(company429.json["usage"]?["rate"]?["window"]?.stringValue == "company-rpm")

            // The new period's rows hold the carried counts plus their own calls.
            let newest = "(SELECT max(id) FROM plan_periods WHERE company_id = '\(company.text)')"
            #expect(try await h.scalar("SELECT rate_calls FROM company_usage WHERE period_id = \(newest)") == 5)
            #expect(
                try await h.scalar("SELECT rate_calls FROM user_usage WHERE period_id = \(newest) AND user_id = '\(users[0].id.text)'")
                    == 3)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 5)
        }
    }

    @Test(
        "user_tpm: the settlement trades the hold for the real count in the user's row and the ledger; a refund then gives back that count, and the call only if the provider never answered it"
    )
    func refundAfterSettlement() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await RateWindowTests.setLimits(h, plan: "p", .obj(["user_tpm": 1_000_000, "company_tpm": 1_000_000]))
            let (company, users) = try await h.createCompany(plan: "p", users: 1)
            try await RateWindowTests.roomInMinute(20)
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.message(key: users[0].key).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE settled_at IS NOT NULL", equals: 2) == 2)
            let real = try await h.scalar(
                "SELECT sum(input_tokens + output_tokens + coalesce(cache_read_tokens, 0) + coalesce(cache_write_5m_tokens, 0)"
                    + " + coalesce(cache_write_1h_tokens, 0)) FROM usage_ledger")
            #expect(real > 0)
            #expect(try await h.scalar("SELECT sum(rate_tokens) FROM usage_ledger") == real)
            #expect(try await h.scalar("SELECT rate_tokens FROM user_usage") == real)
            #expect(try await h.scalar("SELECT rate_tokens FROM company_usage") == real)

            // One call the provider answered with an error given back (as the gateway's refund
            // does): its real count leaves both windows, the call stays (the provider saw it).
            let ledger = try await h.scalar("SELECT min(id) FROM usage_ledger")
            let first = try await h.scalar("SELECT rate_tokens FROM usage_ledger WHERE id = \(ledger)")
            try await h.exec("SELECT capgate_refund('\(company.text)', \(ledger), 500)")
            #expect(try await h.scalar("SELECT rate_tokens FROM user_usage") == real - first)
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == 2)
            #expect(try await h.scalar("SELECT rate_tokens FROM company_usage") == real - first)
            #expect(try await h.scalar("SELECT rate_calls FROM company_usage") == 2)
            #expect(try await h.scalar("SELECT count(*) FROM rate_calls") == 0)
            // One the provider never answered (no status: a give-back) leaves the call windows too.
            let second = try await h.scalar("SELECT max(id) FROM usage_ledger")
            try await h.exec("SELECT capgate_refund('\(company.text)', \(second), NULL)")
            #expect(try await h.scalar("SELECT rate_tokens FROM user_usage") == 0)
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == 1)
            #expect(try await h.scalar("SELECT rate_tokens FROM company_usage") == 0)
            #expect(try await h.scalar("SELECT rate_calls FROM company_usage") == 1)
        }
    }

    @Test(
        "company_tpm, 64 callers over two gateways while answers settle: the minute never takes more than its limit, and takes more calls than their holds alone fit"
    )
    func exactUnderLoad() async throws {
        try await Harness.with { first in
            try await first.createPlan("p", company: nil, user: nil)
            // Each call holds the body's bytes plus costs.promptOverheadTokens (1,000), plus max_tokens;
            // the limit is four such holds.
            let body = #"{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#
            let hold = Int64(body.utf8.count) + 1_000 + 16
            let limit = 4 * hold
            try await RateWindowTests.setLimits(first, plan: "p", .obj(["company_tpm": .int(limit)]))
            let (company, users) = try await first.createCompany(plan: "p", users: 4)
            try await Harness.with(database: first.databaseURL) { second in
                try await RateWindowTests.roomInMinute(20)
                let call: @Sendable (String, String) async throws -> Int = { key, base in
                    try await first.request(
                        .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "application/json")], body: body,
                        base: base
                    ).status
                }
                let statuses = try await withThrowingTaskGroup(of: [Int].self) { group in
                    for caller in 0..<64 {
                        let base = caller % 2 == 0 ? first.gatewayURL : second.gatewayURL
                        group.addTask {
                            var seen: [Int] = []
                            for _ in 0..<4 {
                                seen.append(try await call(users[caller % 4].key, base))
                                try await Task.sleep(for: .milliseconds(150))
                            }
                            return seen
                        }
                    }
                    return try await group.reduce(into: []) { $0 += $1 }
                }
                #expect(statuses.allSatisfy { $0 == 200 || $0 == 429 }, "\(statuses)")
                #expect(statuses.contains(429))
                let admitted = Int64(statuses.filter { $0 == 200 }.count)
                // More than four holds' worth of calls: the settled ones left their room to others.
                #expect(admitted > 4)
                let charged = "FROM usage_ledger WHERE outcome = 'charged'"
                #expect(try await first.eventually("SELECT count(*) \(charged) AND settled_at IS NULL", equals: 0) == 0)
                #expect(try await first.scalar("SELECT count(*) \(charged)") == admitted)
                // The provider served exactly the calls charged: none past the window, none lost.
                #expect(Int64(first.mock.served.count + second.mock.served.count) == admitted)
                let real = try await first.scalar("SELECT sum(input_tokens + output_tokens) \(charged)")
                #expect(try await first.scalar("SELECT sum(rate_tokens) \(charged)") == real)
                #expect(real <= limit)
                // The company's window holds the real count of every call (each settled into it).
                #expect(try await first.scalar("SELECT rate_tokens FROM company_usage WHERE company_id = '\(company.text)'") == real)
                // One more call fits exactly when its hold fits what is left.
                let next = try await call(users[0].key, first.gatewayURL)
                #expect(next == (real + hold <= limit ? 200 : 429))
            }
        }
    }
}
