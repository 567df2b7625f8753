import AsyncHTTPClient
import CapGate
import Foundation
import NIOCore
import Testing

/// SPEC §14: per-minute windows and calls in flight, kept in PostgreSQL rows in the admission
/// transaction, so exact across gateways.
@Suite("Rate windows and concurrency", .timeLimit(.minutes(5)))
struct RateWindowTests {
    /// Waits, if needed, so that at least `seconds` of the current UTC minute remain: a test that
    /// counts one minute's window must not straddle two.
    static func roomInMinute(_ seconds: Double) async throws {
        let into = Date().timeIntervalSince1970.truncatingRemainder(dividingBy: 60)
        if 60 - into < seconds { try await Task.sleep(for: .seconds(60 - into + 0.2)) }
    }

    /// Sets a plan's limits; a token window bounds only priced calls (SPEC §11), so setting one
    /// prices the harness's model (`claude-test`) first.
    static func setLimits(_ h: Harness, plan: String, _ fields: JSON) async throws {
        if ["company_tpm", "user_tpm"].contains(where: { fields[$0] != nil && fields[$0] != .null }) {
            try await h.exec(CostBudgetTests.priceRow + " ON CONFLICT DO NOTHING")
        }
        let reply = try await h.op(.PUT, "/admin/v1/plans/\(plan)", fields)
        #expect(reply.status == 200, "\(reply.body)")
    }

    @Test("user_rpm 30, 64 concurrent callers over two gateways: exactly 30 admitted in the minute, the rest 429 with usage.rate")
    func exactAcrossGateways() async throws {
        try await Harness.with { first in
            try await first.createPlan("p", company: nil, user: nil)
            try await Self.setLimits(first, plan: "p", .obj(["user_rpm": 30]))
            let (company, users) = try await first.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Harness.with(database: first.databaseURL) { second in
                try await Self.roomInMinute(20)
                let replies = try await withThrowingTaskGroup(of: [Harness.Reply].self) { group in
                    for caller in 0..<64 {
                        let base = caller % 2 == 0 ? first.gatewayURL : second.gatewayURL
                        group.addTask {
                            [try await first.message(key: key, base: base), try await first.message(key: key, stream: true, base: base)]
                        }
                    }
                    var all: [Harness.Reply] = []
                    for try await replies in group { all += replies }
                    return all
                }
                let admitted = replies.filter { $0.status == 200 }
                let refused = replies.filter { $0.status == 429 }
                #expect(admitted.count == 30)
                #expect(refused.count == 128 - 30)
                #expect(first.mock.served.count + second.mock.served.count == 30)
                #expect(try await first.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 30)
                // The user's period counter row holds the minute, no row per minute; refused calls are not in it.
                #expect(try await first.scalar("SELECT count(*) FROM rate_windows") == 0)
                #expect(try await first.scalar("SELECT count(*) FROM user_usage WHERE rate_calls > 0") == 1)
                #expect(try await first.scalar("SELECT rate_calls FROM user_usage WHERE company_id = '\(company.text)'") == 30)
                let answer = try #require(refused.first)
                #expect(answer.json["error"]?["type"]?.stringValue == "rate_limit_error")
                let rate = answer.json["usage"]?["rate"]
                #expect(rate?["window"]?.stringValue == "user-rpm")
                #expect(rate?["limit"]?.intValue == 30 && rate?["used"]?.intValue == 30)
                let retry = try #require(answer.headers.first(name: "retry-after").flatMap(Int.init))
                #expect((1...60).contains(retry))
                let reset = try #require(rate?["reset_at"]?.stringValue.flatMap(Timestamp.parseStrict))
                #expect(Int(reset.timeIntervalSince1970) % 60 == 0 && reset > Date() && reset <= Date().addingTimeInterval(61))
                #expect(answer.headers.first(name: "ratelimit-policy")?.contains("\"user-rpm\";q=30;w=60") == true)
                #expect(admitted.allSatisfy { $0.headers.first(name: "ratelimit-policy")?.contains("\"user-rpm\";q=30;w=60") == true })
                // GET /v1/usage shows the window.
                let usage = try await first.request(.GET, "/v1/usage", headers: [("x-api-key", key)])
                let windows = usage.json["rate"]?.arrayValue ?? []
                #expect(windows.count == 1 && windows.first?["window"]?.stringValue == "user-rpm")
                #expect(windows.first?["used"]?.intValue == 30 && windows.first?["remaining"]?.intValue == 0)
            }
        }
    }

    @Test(
        "user_rpm 3 and a provider answering 529 (an SDK retrying): the three calls it answered are given back but stay in the minute, the fourth is 429 and never reaches the provider"
    )
    func answeredCallsStayCounted() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await Self.setLimits(h, plan: "p", .obj(["user_rpm": 3]))
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.roomInMinute(15)
            var statuses: [Int] = []
            for _ in 0..<6 {
                statuses.append(try await h.message(key: users[0].key, headers: [("x-mock-status", "529")]).status)
            }
            #expect(statuses == [529, 529, 529, 429, 429, 429])
            // The provider saw three calls, not six; none is charged.
            #expect(h.mock.counter.count == 3)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'refunded'") == 3)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE outcome = 'charged'") == 0)
            #expect(try await h.scalar("SELECT used FROM user_usage") == 0)
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == 3)
        }
    }

    @Test(
        "a call whose own token hold is over user_tpm or company_tpm can never fit: 400 naming max_tokens and the limit (not a 429 the SDKs retry for ever), nothing charged or forwarded"
    )
    func holdOverTokenWindow() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            // A call holds its body's bytes plus costs.promptOverheadTokens (1,000) plus max_tokens (16).
            try await Self.setLimits(h, plan: "p", .obj(["user_tpm": 1_000]))
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            try await Self.roomInMinute(10)
            let refused = try await h.message(key: users[0].key)
            #expect(refused.status == 400, "\(refused.body)")
            #expect(refused.json["error"]?["type"]?.stringValue == "invalid_request_error")
            let message = refused.json["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("max_tokens") && message.contains("1000") && message.contains("user-tpm"), "\(message)")
            #expect(refused.headers.first(name: "retry-after") == nil)
            try await Self.setLimits(h, plan: "p", .obj(["user_tpm": .null, "company_tpm": 1_000]))
            let company = try await h.message(key: users[0].key)
            #expect(company.status == 400)
            #expect(company.json["error"]?["message"]?.stringValue?.contains("company-tpm") == true)
            #expect(h.mock.counter.count == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
            // A limit the hold fits: admitted.
            try await Self.setLimits(h, plan: "p", .obj(["company_tpm": 2_000]))
            #expect(try await h.message(key: users[0].key).status == 200)
        }
    }

    @Test("a free call is counted in no window but carries the RateLimit policies that apply to its caller")
    func freeCallPolicies() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await Self.setLimits(h, plan: "p", .obj(["user_rpm": 3]))
            try await h.exec("INSERT INTO routes (id, method, path, units, items_field) VALUES ('models', 'GET', '/v1/models*', 0, NULL)")
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Self.roomInMinute(15)
            #expect(try await h.message(key: key).status == 200)
            #expect(try await h.message(key: key).status == 200)
            for _ in 0..<4 {
                let free = try await h.request(.GET, "/v1/models", headers: [("x-api-key", key)])
                #expect(free.status == 200)
                #expect(free.headers.first(name: "ratelimit-policy")?.contains("\"user-rpm\";q=3;w=60") == true, "\(free.headers)")
                #expect(free.headers.first(name: "ratelimit")?.contains("\"user-rpm\";r=1") == true, "\(free.headers)")
            }
            // The free calls took nothing: the third metered call still fits, the fourth does not.
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == 2)
            #expect(try await h.message(key: key).status == 200)
            #expect(try await h.message(key: key).status == 429)
        }
    }

    @Test("company_rpm counts every user of the company; a 402 at the cap is not counted in the window")
    func companyWindow() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: 4, user: nil)
            try await Self.setLimits(h, plan: "p", .obj(["company_rpm": 6]))
            let (_, users) = try await h.createCompany(plan: "p", users: 3)
            try await Self.roomInMinute(15)
            var statuses: [Int] = []
            for index in 0..<9 { statuses.append(try await h.message(key: users[index % 3].key).status) }
            // The cap (4 units) refuses first: 402 stays for an allowance used up.
            #expect(statuses == [200, 200, 200, 200, 402, 402, 402, 402, 402])
            #expect(try await h.scalar("SELECT rate_calls FROM company_usage") == 4)
            try await h.exec("UPDATE plans SET monthly_company_cap = NULL")
            statuses = []
            for index in 0..<4 { statuses.append(try await h.message(key: users[index % 3].key).status) }
            #expect(statuses == [200, 200, 429, 429])
            let refused = try await h.message(key: users[2].key)
            #expect(refused.json["usage"]?["rate"]?["window"]?.stringValue == "company-rpm")
            #expect(refused.json["usage"]?["scope"]?.stringValue == "company")
            // The dry run answers as the call would, and records nothing.
            let check = try await h.request(.GET, "/v1/usage/check", headers: [("x-api-key", users[1].key)]).json
            #expect(check["allowed"]?.boolValue == false && check["reason"]?.stringValue == "rate_limit_error")
            #expect(check["usage"]?["rate"]?["window"]?.stringValue == "company-rpm")
            #expect(check["usage"]?["rate"]?["used"]?.intValue == 6)
            #expect(try await h.scalar("SELECT rate_calls FROM company_usage") == 6)
        }
    }

    @Test("a plan's rate fields: set, read back, validated with 400 naming the field, null for none")
    func planFields() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            let fields: JSON = .obj([
                "company_rpm": 100, "user_rpm": 10, "company_tpm": 1_000_000, "user_tpm": 50_000, "user_concurrency": 3,
            ])
            try await Self.setLimits(h, plan: "p", fields)
            let plan = try await h.op(.GET, "/admin/v1/plans/p").json
            for key in ["company_rpm", "user_rpm", "company_tpm", "user_tpm", "user_concurrency"] {
                #expect(plan[key] == fields[key], "\(key)")
            }
            for (key, value) in [("user_rpm", JSON.int(-1)), ("user_concurrency", .string("3")), ("company_tpm", .double(1.5))] {
                let reply = try await h.op(.PUT, "/admin/v1/plans/p", .obj([key: value]))
                #expect(reply.status == 400)
                #expect(reply.json["error"]?["message"]?.stringValue?.contains(key) == true)
            }
            #expect(try await h.op(.GET, "/admin/v1/plans/p").json["user_rpm"]?.intValue == 10)
            try await Self.setLimits(h, plan: "p", .obj(["user_rpm": .null]))
            #expect(try await h.op(.GET, "/admin/v1/plans/p").json["user_rpm"] == .null)
            #expect(try await h.op(.GET, "/admin/v1/plans/p").json["user_concurrency"]?.intValue == 3)
        }
    }

    @Test("an entitlement's windows count its feature's calls apart, after the plan's; its 429 names the feature")
    func entitlementWindows() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await FeatureAdmissionTests.seed(h, plan: "p")
            try await Self.setLimits(h, plan: "p", .obj(["user_rpm": 5]))
            let put = try await h.op(.PUT, "/admin/v1/plans/p/entitlements/analysis", .obj(["user_rpm": 2, "user_concurrency": 4]))
            #expect(put.status == 200 && put.json["user_rpm"]?.intValue == 2 && put.json["company_tpm"] == .null)
            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/chat", .obj([:])).status == 201)
            let bad = try await h.op(.PUT, "/admin/v1/plans/p/entitlements/chat", .obj(["user_tpm": -3]))
            #expect(bad.status == 400 && bad.json["error"]?["message"]?.stringValue?.contains("user_tpm") == true)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Self.roomInMinute(15)
            var statuses: [Int] = []
            for _ in 0..<3 { statuses.append(try await h.message(key: key).status) }
            #expect(statuses == [200, 200, 429])
            let refused = try await h.message(key: key)
            let rate = refused.json["usage"]?["rate"]
            #expect(rate?["window"]?.stringValue == "user-rpm" && rate?["feature"]?.stringValue == "analysis")
            #expect(rate?["limit"]?.intValue == 2 && rate?["used"]?.intValue == 2)
            #expect(refused.headers.first(name: "ratelimit-policy")?.contains("\"feature.analysis.user-rpm\";q=2;w=60") == true)
            // The dry run answers as the call would: the feature's window refuses, the plan's has room.
            let check = { (query: String) in try await h.request(.GET, "/v1/usage/check" + query, headers: [("x-api-key", key)]) }
            let analysis = try await check("?feature=analysis")
            #expect(analysis.json["allowed"]?.boolValue == false && analysis.json["reason"]?.stringValue == "rate_limit_error")
            #expect(analysis.json["usage"]?["rate"]?["window"]?.stringValue == "user-rpm")
            #expect(analysis.json["usage"]?["rate"]?["feature"]?.stringValue == "analysis")
            #expect(analysis.json["usage"]?["rate"]?["limit"]?.intValue == 2 && analysis.json["usage"]?["rate"]?["used"]?.intValue == 2)
            #expect(analysis.headers.first(name: "ratelimit-policy")?.contains("\"feature.analysis.user-rpm\";q=2;w=60") == true)
            #expect(try await check("?feature=chat").json["allowed"]?.boolValue == true)
            #expect(try await check("").json["allowed"]?.boolValue == true)
            // Chat has no window of its own: only the plan's 5 a minute, of which analysis took 2.
            let chat = [("CapGate-Feature", "chat")]
            statuses = []
            for _ in 0..<4 { statuses.append(try await h.message(key: key, headers: chat).status) }
            #expect(statuses == [200, 200, 200, 429])
            let plan = try await h.message(key: key, headers: chat)
            #expect(plan.json["usage"]?["rate"]?["window"]?.stringValue == "user-rpm")
            #expect(plan.json["usage"]?["rate"]?["feature"] == nil)
            let planCheck = try await check("?feature=chat").json
            #expect(planCheck["allowed"]?.boolValue == false && planCheck["usage"]?["rate"]?["window"]?.stringValue == "user-rpm")
            #expect(planCheck["usage"]?["rate"]?["feature"] == nil && planCheck["usage"]?["rate"]?["used"]?.intValue == 5)
            // GET /v1/usage lists the plan's windows, then the entitlement's, which name their feature.
            let read = try await h.request(.GET, "/v1/usage", headers: [("x-api-key", key)]).json
            let windows = read["rate"]?.arrayValue ?? []
            let planRPM = windows.first { $0["window"]?.stringValue == "user-rpm" && $0["feature"] == nil }
            #expect(planRPM?["limit"]?.intValue == 5 && planRPM?["used"]?.intValue == 5, "\(windows)")
            let featureRPM = windows.first { $0["window"]?.stringValue == "user-rpm" && $0["feature"]?.stringValue == "analysis" }
            #expect(featureRPM?["limit"]?.intValue == 2 && featureRPM?["used"]?.intValue == 2 && featureRPM?["remaining"]?.intValue == 0)
            let featureSlots = windows.first { $0["window"]?.stringValue == "user-concurrency" && $0["feature"]?.stringValue == "analysis" }
            #expect(featureSlots?["limit"]?.intValue == 4 && featureSlots?["used"]?.intValue == 0, "\(windows)")
            #expect(!windows.contains { $0["feature"]?.stringValue == "chat" })
            // The feature's window in a rate_windows row, the plan's in the user's counter row.
            #expect(try await h.scalar("SELECT count(*) FROM rate_windows") == 1)
            #expect(try await h.scalar("SELECT calls FROM rate_windows WHERE feature_id = 'analysis'") == 2)
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == 5)
        }
    }

    @Test(
        "a token window, the plan's or an entitlement's, refuses an unpriced model 400 naming it and charges nothing; call windows do not need a price"
    )
    func tokenWindowNeedsPrice() async throws {
        try await Harness.with { h in
            try await h.createPlan("p", company: nil, user: nil)
            try await FeatureAdmissionTests.seed(h, plan: "p")
            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/chat", .obj([:])).status == 201)
            let (_, users) = try await h.createCompany(plan: "p", users: 1)
            let key = users[0].key
            try await Self.roomInMinute(15)
            // A call window and a concurrency limit: an unpriced model passes.
            #expect(try await h.op(.PUT, "/admin/v1/plans/p", .obj(["user_rpm": 100, "user_concurrency": 5])).status == 200)
            #expect(try await h.message(key: key).status == 200)
            let charged = try await h.scalar("SELECT count(*) FROM usage_ledger")
            // The plan's token window: 400 invalid_request_error naming the model, nothing counted.
            #expect(try await h.op(.PUT, "/admin/v1/plans/p", .obj(["user_tpm": 1_000_000])).status == 200)
            let variants: [[(String, String)]] = [[], [("CapGate-Feature", "chat")]]
            for headers in variants {
                let refused = try await h.message(key: key, headers: headers)
                #expect(refused.status == 400, "\(refused.body)")
                #expect(refused.json["error"]?["type"]?.stringValue == "invalid_request_error")
                #expect(refused.json["error"]?["message"]?.stringValue?.contains("\"claude-test\" has no price") == true)
            }
            // An entitlement's token window alone: its feature's calls refused, another feature's pass.
            #expect(try await h.op(.PUT, "/admin/v1/plans/p", .obj(["user_tpm": .null])).status == 200)
            #expect(try await h.op(.PUT, "/admin/v1/plans/p/entitlements/analysis", .obj(["company_tpm": 1_000_000])).status == 200)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "analysis")]).status == 400)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "chat")]).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == charged + 1)
            #expect(try await h.scalar("SELECT rate_calls FROM user_usage") == charged + 1)
            // Priced, the same call is held in the window and served.
            try await h.exec(CostBudgetTests.priceRow)
            #expect(try await h.message(key: key, headers: [("CapGate-Feature", "analysis")]).status == 200)
            #expect(try await h.scalar("SELECT tokens FROM rate_windows WHERE feature_id = 'analysis'") > 0)
            // The provider served exactly the calls charged: no refused call reached it.
            #expect(Int64(h.mock.counter.count) == (try await h.scalar("SELECT count(*) FROM usage_ledger")))
        }
    }
}
