import AsyncHTTPClient
import CapGate
import Foundation
import NIOCore
import Testing

/// SPEC §11 through the real gateway, PostgreSQL and the mock provider over HTTP: what a call is
/// held, what it is settled at (checked to the micro-dollar against hand-computed numbers), the
/// refusals, refunds, a cost past its hold, and a client that leaves mid-stream.
@Suite("Cost budgets", .timeLimit(.minutes(10)))
struct CostBudgetTests {
    /// USD per million tokens: input 3, output 15, cache writes 3.75 (5 min) and 6 (1 h), cache
    /// reads 0.3; a 200,000-token window.
    static let priceRow = """
        INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read)
        VALUES ('claude-test', '2020-01-01Z', 200000, 3000000, 15000000, 3750000, 6000000, 300000)
        """

    /// A Messages body of a known size.
    static func body(
        text: String = "Hello there", maxTokens: Int? = 16, stream: Bool = false, model: String = "claude-test", extra: String = ""
    ) -> String {
        let max = maxTokens.map { #""max_tokens":\#($0),"# } ?? ""
        return #"{"model":"\#(model)",\#(max)"stream":\#(stream),\#(extra)"messages":[{"role":"user","content":"\#(text)"}]}"#
    }

    /// The hold of `body` at `priceRow` without cache_control: (bytes + 1,000) × $3 + max_tokens × $15 per million.
    static func hold(_ body: String, maxTokens: Int64 = 16, inputRate: Int64 = 3) -> Int64 {
        (Int64(body.utf8.count) + 1_000) * inputRate + maxTokens * 15
    }

    func call(_ h: Harness, key: String, _ body: String, headers: [(String, String)] = []) async throws -> Harness.Reply {
        try await h.request(
            .POST, "/v1/messages",
            headers: [("x-api-key", key), ("anthropic-version", "2023-06-01"), ("content-type", "application/json")] + headers,
            body: body)
    }

    /// A company on a plan with the given budgets (micro-dollars, nil: unlimited), with one user.
    func setUp(_ h: Harness, company: Int64?, user: Int64?) async throws -> (company: UUID, user: UUID, key: String) {
        try await h.createBudgetPlan("p", company: 1000, user: 1000, companyBudget: company, userBudget: user)
        let (companyID, users) = try await h.createCompany(plan: "p", users: 1)
        return (companyID, users[0].id, users[0].key)
    }

    func counters(_ h: Harness, _ company: UUID) async throws -> (used: Int64, held: Int64, userUsed: Int64, userHeld: Int64) {
        (
            try await h.scalar("SELECT cost_used FROM company_usage WHERE company_id = '\(company.text)'"),
            try await h.scalar("SELECT cost_held FROM company_usage WHERE company_id = '\(company.text)'"),
            try await h.scalar("SELECT sum(cost_used) FROM user_usage WHERE company_id = '\(company.text)'"),
            try await h.scalar("SELECT sum(cost_held) FROM user_usage WHERE company_id = '\(company.text)'")
        )
    }

    @Test("a call is held its worst case and settled at its usage's cost, whole or streamed, to the micro-dollar")
    func holdAndSettle() async throws {
        try await Harness.with { h in
            let (company, _, key) = try await setUp(h, company: 1_000_000, user: nil)
            let body = Self.body()
            let reply = try await call(h, key: key, body)
            #expect(reply.status == 200)
            #expect(reply.headers.first(name: "ratelimit-policy")?.contains(#""company-cost";q=1000000"#) == true)
            // While held: the state the answer's head carried counts the hold.
            let hold = Self.hold(body)
            #expect(reply.headers.first(name: "ratelimit")?.contains(#""company-cost";r=\#(1_000_000 - hold)"#) == true)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 1) == 1)
            // The mock bills bytes / 4 input tokens and 7 output tokens.
            let cost = Int64(body.utf8.count / 4) * 3 + 7 * 15
            #expect(try await h.scalar("SELECT hold_micros FROM usage_ledger") == hold)
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger") == cost)
            var state = try await counters(h, company)
            #expect(state.used == cost && state.held == 0 && state.userUsed == cost && state.userHeld == 0)

            // Streamed: the same body's usage from message_start and the last message_delta.
            let streamed = Self.body(stream: true)
            #expect(try await call(h, key: key, streamed, headers: [("x-mock-output-tokens", "9")]).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 2) == 2)
            let streamCost = Int64(streamed.utf8.count / 4) * 3 + 9 * 15
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger ORDER BY id DESC LIMIT 1") == streamCost)
            state = try await counters(h, company)
            #expect(state.used == cost + streamCost && state.held == 0)
        }
    }

    @Test("cache writes 5m and 1h and cache reads are held and priced at their own rates")
    func cacheRates() async throws {
        try await Harness.with { h in
            let (company, _, key) = try await setUp(h, company: 1_000_000, user: nil)
            let system = #""system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],"#
            let body = Self.body(extra: system)
            #expect(try await call(h, key: key, body, headers: [("x-mock-cache-read", "1000")]).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 1) == 1)
            // Held at the 1-hour write rate ($6), the highest input-side rate the body can meet.
            #expect(try await h.scalar("SELECT hold_micros FROM usage_ledger") == Self.hold(body, inputRate: 6))
            // The mock writes half the prompt to the 1-hour cache and reads 1,000 tokens from it.
            let all = Int64(body.utf8.count / 4)
            let written = all / 2
            let cost = (all - written) * 3 + written * 6 + 7 * 15 + (1_000 * 300_000 + 999_999) / 1_000_000
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger") == cost)
            #expect(try await h.scalar("SELECT cache_write_1h_tokens FROM usage_ledger") == written)
            #expect(try await h.scalar("SELECT cache_read_tokens FROM usage_ledger") == 1_000)
            #expect(try await counters(h, company).used == cost)

            // Five minutes: the 5-minute rate; the split of cache_creation as the provider gives it.
            let usage =
                #"{"input_tokens":10,"output_tokens":3,"cache_creation_input_tokens":3000,"#
                + #""cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000}}"#
            #expect(try await call(h, key: key, body, headers: [("x-mock-usage", usage)]).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 2) == 2)
            // 10 × 3 + 1,000 × 3.75 + 2,000 × 6 + 3 × 15 = 30 + 3,750 + 12,000 + 45 micro-dollars.
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger ORDER BY id DESC LIMIT 1") == 15_825)
            #expect(try await h.scalar("SELECT cache_write_5m_tokens FROM usage_ledger ORDER BY id DESC LIMIT 1") == 1_000)
        }
    }

    @Test("budget_exceeded: used + held + hold must fit, company budget before user budget; 402 with the cost object; nothing changes")
    func budgetExceeded() async throws {
        try await Harness.with { h in
            let body = Self.body()
            let hold = Self.hold(body)
            let (company, user, key) = try await setUp(h, company: hold - 1, user: nil)
            let reply = try await call(h, key: key, body)
            #expect(reply.status == 402)
            #expect(reply.json["error"]?["type"]?.stringValue == "budget_exceeded")
            let cost = reply.json["usage"]?["cost"]
            #expect(cost?["scope"]?.stringValue == "company")
            #expect(cost?["hold"]?.stringValue == Micros(hold).decimal)
            #expect(cost?["limit"]?.stringValue == Micros(hold - 1).decimal)
            #expect(cost?["used"]?.stringValue == "0" && cost?["held"]?.stringValue == "0")
            #expect(cost?["remaining"]?.stringValue == Micros(hold - 1).decimal)
            #expect(reply.headers.first(name: "retry-after").flatMap(Int.init) ?? 0 > 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
            #expect(try await h.scalar("SELECT coalesce(sum(used + cost_held), 0) FROM company_usage") == 0)
            #expect(try await h.scalar("SELECT coalesce(sum(used + cost_held), 0) FROM user_usage") == 0)

            // Exactly the hold fits (≤); the user's own budget (an override) is checked after the company's.
            try await h.exec("UPDATE plans SET monthly_company_budget = \(hold)")
            try await h.exec("UPDATE users SET monthly_budget = \(hold - 1) WHERE id = '\(user.text)'")
            let byUser = try await call(h, key: key, body)
            #expect(byUser.status == 402)
            #expect(byUser.json["usage"]?["cost"]?["scope"]?.stringValue == "user")
            try await h.exec("UPDATE users SET monthly_budget = NULL")
            #expect(try await call(h, key: key, body).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 1) == 1)
            #expect(try await counters(h, company).used < hold)
        }
    }

    @Test(
        "where a budget applies, no max_tokens, an unpriced model, server tools and a premium-priced mode are 400 and change nothing; elsewhere they pass"
    )
    func cannotBeHeld() async throws {
        try await Harness.with { h in
            let (_, _, key) = try await setUp(h, company: 1_000_000, user: nil)
            let tools = #""tools":[{"type":"web_search_20250305","name":"web_search"}],"#
            let cases = [
                (Self.body(maxTokens: nil), "max_tokens"), (Self.body(model: "gpt-unknown"), "gpt-unknown"),
                (Self.body(extra: tools), "web_search_20250305"),
                (#"{"requests":[{"custom_id":"a","params":{"model":"claude-test","max_tokens":5}}]}"#, "batch"),
                // Billed by the provider at a multiple of the model's rates, which the price book does not hold.
                (Self.body(extra: #""speed":"fast","#), "speed"), (Self.body(extra: #""inference_ge\u006f":"us","#), "inference_geo"),
                // A provider-defined tool whose added tokens costs.toolOverheadTokens does not list.
                (Self.body(extra: #""tools":[{"type":"bash_20990101","name":"bash"}],"#), "bash_20990101"),
            ]
            for (body, words) in cases {
                let reply = try await call(h, key: key, body)
                #expect(reply.status == 400, "\(words)")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
                #expect(reply.json["error"]?["message"]?.stringValue?.contains(words) == true, "\(reply.body)")
            }
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
            #expect(try await h.scalar("SELECT coalesce(sum(used + cost_held), 0) FROM company_usage") == 0)
            #expect(h.mock.counter.count == 0, "a refused call reached the provider")
            // The standard rate's values are held as any call; so are the tools whose tokens are listed.
            #expect(try await call(h, key: key, Self.body(extra: #""speed":"standard","inference_geo":"global","#)).status == 200)
            #expect(try await call(h, key: key, Self.body(extra: #""tools":[{"type":"bash_20250124","name":"bash"}],"#)).status == 200)

            // No budget: they pass as before (tokens recorded; cost where priced).
            try await h.exec("UPDATE plans SET monthly_company_budget = NULL")
            for (body, words) in cases.prefix(3) {
                #expect(try await call(h, key: key, body).status == 200, "\(words)")
            }
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE settled_at IS NOT NULL", equals: 5) == 5)
            // Without max_tokens, or with server tools, nothing was held, but the usage is priced.
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE hold_micros IS NULL AND cost_source = 'usage'") == 2)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE model = 'gpt-unknown' AND cost_micros IS NULL") == 1)
            let mismatches = try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger)
            #expect(mismatches.isEmpty)
        }
    }

    @Test("an upstream 500 gives the hold back; a provider billing past the hold is charged as billed, logged and counted")
    func refundAndOverHold() async throws {
        try await Harness.with { h in
            let (company, _, key) = try await setUp(h, company: 1_000_000, user: nil)
            let body = Self.body()
            #expect(try await call(h, key: key, body, headers: [("x-mock-status", "500")]).status == 500)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") == 1)
            var state = try await counters(h, company)
            #expect(state.used == 0 && state.held == 0 && state.userHeld == 0)

            let before = try await overHolds(h)
            let usage = #"{"input_tokens":100000,"output_tokens":5}"#
            #expect(try await call(h, key: key, body, headers: [("x-mock-usage", usage)]).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 1) == 1)
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger WHERE cost_source = 'usage'") == 300_075)
            state = try await counters(h, company)
            #expect(state.used == 300_075 && state.held == 0)
            // Counted once the settlement's answer is back in the gateway, just after its commit.
            var counted = try await overHolds(h)
            for _ in 0..<100 where counted == before {
                try await Task.sleep(for: .milliseconds(50))
                counted = try await overHolds(h)
            }
            // (At least: the counter is the process's, and other suites' calls may add to it meanwhile.)
            #expect(counted >= before + 1)
        }
    }

    func overHolds(_ h: Harness) async throws -> Int {
        let text = try await h.request(.GET, "/metrics", headers: h.asOperator).body
        let line = text.split(separator: "\n").first { $0.hasPrefix("capgate_cost_over_hold_total ") }
        return line.flatMap { Int($0.split(separator: " ").last ?? "") } ?? 0
    }

    @Test("a client that leaves mid-stream is charged the usage read after it left; with no time to drain, its hold")
    func disconnect() async throws {
        for drain in [60, 0] {
            try await Harness.with(settings: ["costs.drainSeconds": "\(drain)"]) { h in
                let (_, _, key) = try await setUp(h, company: 1_000_000, user: nil)
                let body = Self.body(maxTokens: 64, stream: true)
                let request = h.streamingRequest(
                    key: key, headers: [("x-mock-chunk-delay-ms", "150"), ("x-mock-output-tokens", "40")], body: body)
                let client = Task {
                    let response = try await Harness.http.execute(request, timeout: .seconds(30))
                    for try await _ in response.body { break }
                    try await Task.sleep(for: .seconds(60))
                }
                #expect(try await h.eventually("SELECT count(*) FROM usage_ledger", equals: 1) == 1)
                try await Task.sleep(for: .milliseconds(200))
                client.cancel()
                #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source IS NOT NULL", equals: 1) == 1)
                if drain > 0 {
                    #expect(try await h.text("SELECT cost_source FROM usage_ledger") == "usage")
                    #expect(try await h.scalar("SELECT output_tokens FROM usage_ledger") == 40)
                    #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger") == Int64(body.utf8.count / 4) * 3 + 40 * 15)
                } else {
                    #expect(try await h.text("SELECT cost_source FROM usage_ledger") == "hold")
                    #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger") == Self.hold(body, maxTokens: 64))
                }
            }
        }
    }

    @Test("an Idempotency-Key: the retry replays and holds nothing again; a key refused by the budget can be used once it fits")
    func idempotency() async throws {
        try await Harness.with { h in
            let body = Self.body()
            let hold = Self.hold(body)
            let (company, _, key) = try await setUp(h, company: 1_000_000, user: nil)
            let first = try await call(h, key: key, body, headers: [("idempotency-key", "k1")])
            #expect(first.status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 1) == 1)
            let again = try await call(h, key: key, body, headers: [("idempotency-key", "k1")])
            #expect(again.status == 200 && again.body == first.body)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 1)
            let spent = try await counters(h, company).used
            let ledger = try await h.scalar("SELECT cost_micros FROM usage_ledger")
            #expect(spent > 0 && spent == ledger)
            #expect(try await counters(h, company).held == 0)

            try await h.exec("UPDATE plans SET monthly_company_budget = \(spent + hold - 1)")
            let refused = try await call(h, key: key, body, headers: [("idempotency-key", "k2")])
            #expect(refused.status == 402 && refused.json["error"]?["type"]?.stringValue == "budget_exceeded")
            try await h.exec("UPDATE plans SET monthly_company_budget = \(spent + hold)")
            #expect(try await call(h, key: key, body, headers: [("idempotency-key", "k2")]).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE idempotency_key = 'k2'") == 1)
        }
    }

    @Test("a batch whose calls straddle a new price: each call is held and settled at the price in force at its own time")
    func batchAcrossPriceChange() async throws {
        try await Harness.with { h in
            let (company, user, _) = try await setUp(h, company: 1_000_000_000, user: nil)
            // An hour from now input costs 6 instead of 3; calls a minute before, a minute after and two
            // minutes before it, in one batch (all within the company's current period).
            let change = Date().addingTimeInterval(3600)
            try await h.exec(
                """
                INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read)
                VALUES ('claude-test', '\(Timestamp.format(change))', 200000, 6000000, 15000000, 7500000, 12000000, 600000)
                """)
            let times = [-60.0, 60, -120].map { Timestamp.format(change.addingTimeInterval($0)) }
            let holds = try await h.text(
                """
                SELECT string_agg(hold::text, ',' ORDER BY item) FROM capgate_admit_batch(
                    array_fill(''::bytea, ARRAY[3]), array_fill('\(company.text)'::uuid, ARRAY[3]),
                    array_fill('\(user.text)'::uuid, ARRAY[3]), array_fill(1, ARRAY[3]), array_fill('POST'::text, ARRAY[3]),
                    array_fill('/v1/messages'::text, ARRAY[3]), array_fill('claude-test'::text, ARRAY[3]),
                    array_fill(''::text, ARRAY[3]), ARRAY['a', 'b', 'c'], array_fill(-1::bigint, ARRAY[3]),
                    ARRAY['\(times[0])', '\(times[1])', '\(times[2])']::timestamptz[], false,
                    array_fill(1000::bigint, ARRAY[3]), array_fill(0::bigint, ARRAY[3]), array_fill(0::smallint, ARRAY[3]),
                    array_fill(0::bigint, ARRAY[3]))
                """)
            // 1,000 prompt tokens at $3 or $6 per million, no output.
            #expect(holds == "3000,6000,3000")
            // Settled in one batch too: the model is priced once at its latest call (b, the new
            // row), and the calls before the change are looked up alone. 500 input and 2 output
            // tokens each: 500 × 3 + 2 × 15 = 1,530, or 500 × 6 + 2 × 15 = 3,030.
            try await h.exec(
                """
                SELECT count(*) FROM capgate_settle_batch(
                    (SELECT array_agg(company_id ORDER BY request_id) FROM usage_ledger),
                    (SELECT array_agg(id ORDER BY request_id) FROM usage_ledger),
                    array_fill(200, ARRAY[3]), array_fill(500::bigint, ARRAY[3]), array_fill(2::bigint, ARRAY[3]),
                    array_fill(0::bigint, ARRAY[3]), array_fill(0::bigint, ARRAY[3]), array_fill(0::bigint, ARRAY[3]),
                    array_fill(true, ARRAY[3]), array_fill(-3::bigint, ARRAY[3]))
                """)
            let costs = try await h.text("SELECT string_agg(cost_micros::text, ',' ORDER BY request_id) FROM usage_ledger")
            #expect(costs == "1530,3030,1530")
            let (used, held, userUsed, userHeld) = try await counters(h, company)
            #expect([used, held, userUsed, userHeld] == [6090, 0, 6090, 0])
        }
    }

    @Test("the price in force decides: exact id before prefix, the latest effective_from before the call, the long-prompt tier")
    func priceSelection() async throws {
        try await Harness.with { h in
            let (_, _, key) = try await setUp(h, company: 1_000_000_000, user: nil)
            // A prefix row (less specific) and a future row of the exact id do not apply.
            try await h.exec(
                """
                INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read)
                VALUES ('claude-*', '2021-01-01Z', 200000, 90000000, 90000000, 90000000, 90000000, 90000000),
                       ('claude-test', '2999-01-01Z', 200000, 90000000, 90000000, 90000000, 90000000, 90000000)
                """)
            let body = Self.body()
            #expect(try await call(h, key: key, body).status == 200)
            #expect(try await h.scalar("SELECT hold_micros FROM usage_ledger") == Self.hold(body))
            // The long-prompt tier: every token at its rates once the prompt is over the threshold.
            try await h.exec(
                """
                UPDATE prices SET long_prompt_threshold = 1000, long_prompt_input = 6000000, long_prompt_output = 22500000,
                       long_prompt_cache_write_5m = 7500000, long_prompt_cache_write_1h = 12000000, long_prompt_cache_read = 600000
                 WHERE model = 'claude-test' AND effective_from = '2020-01-01Z'
                """)
            let long = Self.body(text: String(repeating: "a", count: 8_000))
            #expect(try await call(h, key: key, long).status == 200)
            #expect(try await h.eventually("SELECT count(*) FROM usage_ledger WHERE cost_source = 'usage'", equals: 2) == 2)
            let last = "SELECT %@ FROM usage_ledger ORDER BY id DESC LIMIT 1"
            // Held: (bytes + 1,000) × $6 + 16 × $22.5; billed: bytes / 4 (over 1,000) × $6 + 7 × $22.5, rounded up once.
            #expect(
                try await h.scalar(last.replacingOccurrences(of: "%@", with: "hold_micros"))
                    == (Int64(long.utf8.count) + 1_000) * 6 + 16 * 45 / 2)
            #expect(
                try await h.scalar(last.replacingOccurrences(of: "%@", with: "cost_micros"))
                    == Int64(long.utf8.count / 4) * 6 + (7 * 45 + 1) / 2)
            // The short call before it stays at the short rates.
            #expect(try await h.scalar("SELECT cost_micros FROM usage_ledger ORDER BY id LIMIT 1") == Int64(body.utf8.count / 4) * 3 + 105)
        }
    }
}
