import Foundation
import Testing

@testable import CapGate

/// The read models' JSON, byte for byte: every key present (`null` where there is nothing,
/// never a missing key), ids in lower case, times as the SPEC's timestamps, money exact.
@Suite("Usage and plan models encode as the API answers them")
struct UsageModelTests {
    static func text(_ value: some Encodable) throws -> String {
        String(decoding: try wireJSON(value), as: UTF8.self)
    }

    static let id = UUID(uuidString: "9F2C1D7E-0000-4000-8000-00000000000A")!
    static let start = Date(timeIntervalSince1970: 1_793_491_200)  // 2026-11-01T00:00:00Z
    static let end = Date(timeIntervalSince1970: 1_796_083_200)  // 2026-12-01T00:00:00Z

    @Test("a plan: caps null when unlimited, the price the same JSON number the Double gave (49, 49.5, 19.99)")
    func plan() throws {
        var plan = PlanRecord(
            id: "p", name: "P/1", monthlyCompanyCap: nil, monthlyUserCap: 5, price: Decimal(string: "19.99")!, currency: "USD",
            isDefault: false, isActive: true, sortOrder: -3)
        #expect(
            try Self.text(plan)
                == #"{"company_rpm":null,"company_tpm":null,"currency":"USD","id":"p","is_active":true,"is_default":false,"#
                + #""monthly_company_budget":null,"monthly_company_cap":null,"monthly_user_budget":null,"monthly_user_cap":5,"name":"P/1","#
                + #""price":19.99,"sort_order":-3,"user_concurrency":null,"user_rpm":null,"user_tpm":null}"#
        )
        for (stored, shown) in [("49.00", "49"), ("49.50", "49.5"), ("0.00", "0"), ("9999999999.99", "9999999999.99")] {
            plan.price = try #require(PlanRecord.decimal(stored))
            #expect(try Self.text(plan).contains(#""price":\#(shown),"#))
        }
        #expect(PlanRecord.decimal("1e2") == nil && PlanRecord.decimal("-1") == nil && PlanRecord.decimal("") == nil)
        #expect(try Self.text(ListPage([plan])).hasSuffix(#"],"has_more":false,"next_cursor":null}"#))
    }

    @Test("history, overview, event and user entries keep every key, nulls included")
    func readModels() throws {
        let period = PeriodUsage(start: Self.start, end: Self.end, planID: "low", planName: "Low", used: 7, limit: nil, feature: nil)
        #expect(
            try Self.text(period)
                == #"{"company":{"limit":null,"remaining":null,"used":7},"#
                + #""cost":{"company":{"held":"0","limit":null,"remaining":null,"used":"0"}},"feature":null,"limit":null,"#
                + #""period":{"end":"2026-12-01T00:00:00Z","start":"2026-11-01T00:00:00Z"},"plan":{"id":"low","name":"Low"},"used":7}"#)
        let capped = PeriodUsage(
            start: Self.start, end: Self.end, planID: "low", planName: "Low", used: 12, limit: 10, feature: "scan",
            cost: CostCounter(used: 1_234_567, held: 10, limit: 2_000_000))
        #expect(
            try Self.text(capped).hasPrefix(
                #"{"company":{"limit":10,"remaining":0,"used":12},"#
                    + #""cost":{"company":{"held":"0.00001","limit":"2","remaining":"0.765423","used":"1.234567"}},"#
                    + #""feature":"scan","limit":10,"#))

        let overview = CompanyOverview(id: Self.id, name: "Co", plan: nil, periodEnd: nil, used: 0, cap: nil, percentUsed: nil)
        #expect(
            try Self.text(overview)
                == #"{"cap":null,"id":"9f2c1d7e-0000-4000-8000-00000000000a","name":"Co","percent_used":null,"period_end":null,"#
                + #""plan":null,"used":0}"#)
        let busy = CompanyOverview(id: Self.id, name: "Co", plan: "low", periodEnd: Self.end, used: 4, cap: 10, percentUsed: 40)
        #expect(try Self.text(busy).contains(#""percent_used":40,"period_end":"2026-12-01T00:00:00Z","plan":"low""#))

        let user = UserUsage(id: Self.id, email: nil, role: "member", disabled: false, used: 3, limit: nil, features: [])
        #expect(
            try Self.text(user)
                == #"{"cost":{"held":"0","limit":null,"remaining":null,"used":"0"},"#
                + #""disabled":false,"email":null,"features":[],"id":"9f2c1d7e-0000-4000-8000-00000000000a","limit":null,"#
                + #""remaining":null,"role":"member","used":3}"#)

        let event = UsageStore.Event(
            id: 5, createdAt: Self.start, companyID: Self.id, userID: Self.id, periodStart: Self.start, periodEnd: Self.end, units: 1,
            inputTokens: nil, outputTokens: 9, method: "POST", route: "/v1/messages", model: nil, feature: nil, outcome: "charged",
            upstreamStatus: 200, requestID: "req_1", idempotencyKey: nil, settlement: .settled)
        #expect(
            try Self.text(event)
                == #"{"cache_read_tokens":null,"cache_write_tokens":null,"company_id":"9f2c1d7e-0000-4000-8000-00000000000a","#
                + #""cost_source":null,"cost_usd":null,"feature":null,"hold_usd":null,"id":5,"idempotency_key":null,"#
                + #""input_tokens":null,"method":"POST","model":null,"outcome":"charged","output_tokens":9,"#
                + #""period":{"end":"2026-12-01T00:00:00Z","start":"2026-11-01T00:00:00Z"},"request_id":"req_1","#
                + #""route":"/v1/messages","settlement":"settled","time":"2026-11-01T00:00:00Z","units":1,"upstream_status":200,"#
                + #""user_id":"9f2c1d7e-0000-4000-8000-00000000000a"}"#)
    }

    @Test("cost (SPEC §11): decimal strings, remaining = limit − used − held clamped at 0, null when unlimited, user only when given")
    func cost() throws {
        let counter = CostCounter(used: 1_234_567, held: 250_000, limit: 10_000_000)
        #expect(try Self.text(counter) == #"{"held":"0.25","limit":"10","remaining":"8.515433","used":"1.234567"}"#)
        // Spent past the budget (a provider billed over the hold): nothing remains, never a negative.
        #expect(CostCounter(used: 11_000_000, held: 5, limit: 10_000_000).remaining == .zero)
        #expect(CostCounter(used: 9_000_000, held: 2_000_000, limit: 10_000_000).remaining == .zero)
        #expect(CostCounter(used: Micros.max, held: Micros.max, limit: Micros.max).remaining == .zero)
        #expect(try Self.text(CostCounter.unlimited) == #"{"held":"0","limit":null,"remaining":null,"used":"0"}"#)
        let both = CostUsage(company: counter, user: CostCounter(used: 1, held: 0, limit: 0))
        #expect(
            try Self.text(both)
                == #"{"company":{"held":"0.25","limit":"10","remaining":"8.515433","used":"1.234567"},"#
                + #""user":{"held":"0","limit":"0","remaining":"0","used":"0.000001"}}"#)
        #expect(try Self.text(CostUsage(company: .unlimited)) == #"{"company":{"held":"0","limit":null,"remaining":null,"used":"0"}}"#)
        // Added to a usage object: appended, or replacing a `cost` already there.
        let usage = JSON.obj(["scope": "user", "cost": "old"])
        #expect(CostUsage(company: .unlimited).adding(to: usage)["cost"] == CostUsage(company: .unlimited).json)
        #expect(CostUsage.unlimited.adding(to: usage).serialized().components(separatedBy: "cost").count == 2)
    }

    @Test("the per-model read and an event with cost: every key, money exact, null model written")
    func modelsAndEventCost() throws {
        let models = PeriodModels(
            start: Self.start, end: Self.end,
            models: [
                ModelUsage(
                    model: "claude-sonnet-4-5", calls: 2, inputTokens: 30, outputTokens: 3, cacheWriteTokens: 19, cacheReadTokens: 0,
                    cost: Micros(2_000_000), held: .zero),
                ModelUsage(
                    model: nil, calls: 1, inputTokens: 0, outputTokens: 0, cacheWriteTokens: 0, cacheReadTokens: 9, cost: .zero,
                    held: Micros(700_000)),
            ])
        #expect(
            try Self.text(models)
                == #"{"models":[{"cache_read_tokens":0,"cache_write_tokens":19,"calls":2,"cost_usd":"2","held_usd":"0","#
                + #""input_tokens":30,"model":"claude-sonnet-4-5","output_tokens":3},"#
                + #"{"cache_read_tokens":9,"cache_write_tokens":0,"calls":1,"cost_usd":"0","held_usd":"0.7","input_tokens":0,"#
                + #""model":null,"output_tokens":0}],"period":{"end":"2026-12-01T00:00:00Z","start":"2026-11-01T00:00:00Z"}}"#)
        var event = UsageStore.Event(
            id: 5, createdAt: Self.start, companyID: Self.id, userID: Self.id, periodStart: Self.start, periodEnd: Self.end, units: 1,
            inputTokens: 10, outputTokens: 9, method: "POST", route: "/v1/messages", model: "m", feature: nil, outcome: "charged",
            upstreamStatus: 200, requestID: "req_1", idempotencyKey: nil, settlement: .settled)
        event.cacheWriteTokens = 120
        event.cacheReadTokens = 30
        event.hold = Micros(2_000_000)
        event.cost = Micros(1_234_567)
        event.costSource = "usage"
        let text = try Self.text(event)
        #expect(text.hasPrefix(#"{"cache_read_tokens":30,"cache_write_tokens":120,"company_id":"#))
        #expect(text.contains(#""cost_source":"usage","cost_usd":"1.234567","feature":null,"hold_usd":"2","id":5,"#))
        #expect(event.csvLine.hasSuffix("Z,,,settled,120,30,2,1.234567,usage\n"), "\(event.csvLine)")
        #expect(UsageStore.Event.csvHeader.hasSuffix(",settlement,cache_write_tokens,cache_read_tokens,hold_usd,cost_usd,cost_source\n"))
    }

    @Test("a period's start date: YYYY-MM-DD of a real day, nothing else")
    func periodDay() {
        #expect(UsageStore.PeriodChoice(day: "2026-11-01") == .startingOn("2026-11-01"))
        #expect(UsageStore.PeriodChoice(day: "2028-02-29") == .startingOn("2028-02-29"))
        for bad in [
            "2026-02-29", "2026-13-01", "2026-00-10", "2026-11-00", "2026-11-31", "2026-1-01", "26-11-01", "2026-11-01T00:00:00Z",
            "", "0000-01-01", "２０２６-11-01", "2026-11-0a", "+026-11-01",
        ] {
            #expect(UsageStore.PeriodChoice(day: bad) == nil, "\(bad)")
        }
    }

    @Test("products, users and API keys: every key present, nulls written, the key's secret only when given")
    func tenantRecords() throws {
        #expect(
            try Self.text(ProductRecord(productID: "app.low.monthly", planID: "low", interval: "month"))
                == #"{"budget":null,"id":"app.low.monthly","interval":"month","kind":"subscription","plan_id":"low","#
                + #""product_id":"app.low.monthly","units":null,"valid_days":365}"#)
        #expect(
            try Self.text(
                ProductRecord(
                    productID: "app.pack", planID: nil, interval: nil, kind: .topup, units: 50, budget: Micros(2_500_000), validDays: 30))
                == #"{"budget":"2.5","id":"app.pack","interval":null,"kind":"topup","plan_id":null,"product_id":"app.pack","#
                + #""units":50,"valid_days":30}"#)
        let user = UserRecord(
            id: Self.id, companyID: Self.id, email: nil, role: "admin", monthlyCap: nil, disabled: true, createdAt: Self.start)
        #expect(
            try Self.text(user)
                == #"{"company_id":"9f2c1d7e-0000-4000-8000-00000000000a","created_at":"2026-11-01T00:00:00Z","disabled":true,"#
                + #""email":null,"id":"9f2c1d7e-0000-4000-8000-00000000000a","monthly_budget":null,"monthly_cap":null,"role":"admin"}"#)
        var key = ApiKeyRecord(
            id: Self.id, userID: Self.id, prefix: "cg_ab", createdAt: Self.start, revokedAt: nil, features: nil, key: nil)
        #expect(
            try Self.text(key)
                == #"{"created_at":"2026-11-01T00:00:00Z","expires_at":null,"features":null,"#
                + #""id":"9f2c1d7e-0000-4000-8000-00000000000a","last_used_at":null,"name":null,"#
                + #""prefix":"cg_ab","revoked_at":null,"user_id":"9f2c1d7e-0000-4000-8000-00000000000a"}"#)
        key.features = ["scan"]
        key.revokedAt = Self.end
        key.key = "cg_ab_secret"
        #expect(try Self.text(key).contains(#""features":["scan"],"id":"#))
        #expect(
            try Self.text(key).contains(
                #""key":"cg_ab_secret","last_used_at":null,"name":null,"prefix":"cg_ab","revoked_at":"2026-12-01T00:00:00Z""#))
        key.name = "ci"
        key.expiresAt = Self.end
        key.lastUsedAt = Self.start
        #expect(try Self.text(key).contains(#""expires_at":"2026-12-01T00:00:00Z","features":["scan"],"#))
        #expect(try Self.text(key).contains(#""last_used_at":"2026-11-01T00:00:00Z","name":"ci","prefix":"cg_ab""#))
    }
}
