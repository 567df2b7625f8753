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
                == #"{"currency":"USD","id":"p","is_active":true,"is_default":false,"monthly_company_budget":null,"#
                + #""monthly_company_cap":null,"monthly_user_budget":null,"monthly_user_cap":5,"name":"P/1","price":19.99,"sort_order":-3}"#
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
                == #"{"company":{"limit":null,"remaining":null,"used":7},"feature":null,"limit":null,"#
                + #""period":{"end":"2026-12-01T00:00:00Z","start":"2026-11-01T00:00:00Z"},"plan":{"id":"low","name":"Low"},"used":7}"#)
        let capped = PeriodUsage(start: Self.start, end: Self.end, planID: "low", planName: "Low", used: 12, limit: 10, feature: "scan")
        #expect(try Self.text(capped).hasPrefix(#"{"company":{"limit":10,"remaining":0,"used":12},"feature":"scan","limit":10,"#))

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
                == #"{"disabled":false,"email":null,"features":[],"id":"9f2c1d7e-0000-4000-8000-00000000000a","limit":null,"#
                + #""remaining":null,"role":"member","used":3}"#)

        let event = UsageStore.Event(
            id: 5, createdAt: Self.start, companyID: Self.id, userID: Self.id, periodStart: Self.start, periodEnd: Self.end, units: 1,
            inputTokens: nil, outputTokens: 9, method: "POST", route: "/v1/messages", model: nil, feature: nil, outcome: "charged",
            upstreamStatus: 200, requestID: "req_1", idempotencyKey: nil, settlement: .settled)
        #expect(
            try Self.text(event)
                == #"{"company_id":"9f2c1d7e-0000-4000-8000-00000000000a","feature":null,"id":5,"idempotency_key":null,"#
                + #""input_tokens":null,"method":"POST","model":null,"outcome":"charged","output_tokens":9,"#
                + #""period":{"end":"2026-12-01T00:00:00Z","start":"2026-11-01T00:00:00Z"},"request_id":"req_1","#
                + #""route":"/v1/messages","settlement":"settled","time":"2026-11-01T00:00:00Z","units":1,"upstream_status":200,"#
                + #""user_id":"9f2c1d7e-0000-4000-8000-00000000000a"}"#)
    }

    @Test("products, users and API keys: every key present, nulls written, the key's secret only when given")
    func tenantRecords() throws {
        #expect(
            try Self.text(ProductRecord(productID: "app.low.monthly", planID: "low", interval: "month"))
                == #"{"id":"app.low.monthly","interval":"month","plan_id":"low","product_id":"app.low.monthly"}"#)
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
                == #"{"created_at":"2026-11-01T00:00:00Z","features":null,"id":"9f2c1d7e-0000-4000-8000-00000000000a","#
                + #""prefix":"cg_ab","revoked_at":null,"user_id":"9f2c1d7e-0000-4000-8000-00000000000a"}"#)
        key.features = ["scan"]
        key.revokedAt = Self.end
        key.key = "cg_ab_secret"
        #expect(try Self.text(key).contains(#""features":["scan"],"id":"#))
        #expect(try Self.text(key).contains(#""key":"cg_ab_secret","prefix":"cg_ab","revoked_at":"2026-12-01T00:00:00Z""#))
    }
}
