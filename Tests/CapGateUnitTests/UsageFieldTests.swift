import Foundation
import HTTPTypes
import Testing

@testable import CapGate

/// The usage state as a caller sees it (Metering/UsageState.swift): SPEC §3's `usage` object and
/// SPEC §2's RateLimit fields (one policy per bounded cap, feature window (§8) and budget (§11),
/// omitted when unlimited), computed from the counters alone.
@Suite("Usage object and RateLimit fields")
struct UsageFieldTests {
    static let start = UnitTestSupport.time("2026-11-01T00:00:00Z")
    static let end = UnitTestSupport.time("2026-12-01T00:00:00Z")
    /// One hour before the period ends.
    static let now = UnitTestSupport.time("2026-11-30T23:00:00Z")

    static func state(company: (Int64, Int64?) = (40, 100), user: (Int64?, Int64?) = (12, 25)) -> UsageState {
        UsageState(
            plan: .init(id: "low", name: "Low Use"), periodStart: start, periodEnd: end, companyUsed: company.0, companyLimit: company.1,
            userUsed: user.0, userLimit: user.1)
    }

    static func fields(_ state: UsageState, now: Date = UsageFieldTests.now) -> (policy: String?, state: String?) {
        let headers = state.rateLimitHeaders(now: now)
        return (headers[.rateLimitPolicy], headers[.rateLimit])
    }

    @Test("SPEC §3's example usage object, key for key and in its order")
    func specExample() {
        var state = Self.state(company: (100, 100), user: (12, 25))
        state.upgrade = .init(plan: "medium", companyLimit: 500, userLimit: 100)
        let text = state.json(scope: .company).serialized()
        #expect(
            text
                == #"{"scope":"company","plan":{"id":"low","name":"Low Use"},"period":{"start":"2026-11-01T00:00:00Z","end":"2026-12-01T00:00:00Z"},"company":{"used":100,"limit":100,"remaining":0},"user":{"used":12,"limit":25,"remaining":13},"upgrade":{"plan":"medium","company_limit":500,"user_limit":100}}"#
        )
    }

    @Test("limit and remaining are null when unlimited, remaining never below 0; no plan, no period and no upgrade are null")
    func counters() {
        #expect(UsageState.counter(used: 12, limit: 25).serialized() == #"{"used":12,"limit":25,"remaining":13}"#)
        #expect(UsageState.counter(used: 7, limit: nil).serialized() == #"{"used":7,"limit":null,"remaining":null}"#)
        #expect(UsageState.counter(used: 130, limit: 100).serialized() == #"{"used":130,"limit":100,"remaining":0}"#)
        let none = UsageState(plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: nil, userLimit: nil)
        #expect(
            none.json(scope: .user).serialized()
                == #"{"scope":"user","plan":null,"period":null,"company":{"used":0,"limit":null,"remaining":null},"upgrade":null}"#)
        #expect(Self.state().json(scope: .user, includeUser: false)["user"] == nil)
    }

    @Test("RateLimit: one policy per bounded cap, q the cap and w the period's seconds; r what is left and t seconds to its end")
    func caps() {
        let (policy, state) = Self.fields(Self.state())
        #expect(policy == #""company";q=100;w=2592000, "user";q=25;w=2592000"#)
        #expect(state == #""company";r=60;t=3600, "user";r=13;t=3600"#)
    }

    @Test("an unlimited cap has no policy; with none bounded, or no period, there are no RateLimit fields at all")
    func unlimited() {
        #expect(Self.fields(Self.state(company: (40, nil))).policy == #""user";q=25;w=2592000"#)
        #expect(Self.fields(Self.state(user: (12, nil))).state == #""company";r=60;t=3600"#)
        #expect(Self.fields(Self.state(user: (nil, 25))).policy == #""company";q=100;w=2592000"#)
        let open = Self.fields(Self.state(company: (40, nil), user: (12, nil)))
        #expect(open.policy == nil && open.state == nil)
        var noPeriod = Self.state()
        noPeriod.periodEnd = nil
        #expect(noPeriod.rateLimitHeaders(now: Self.now).isEmpty)
    }

    @Test("r is never negative; t rounds a partial second up and is 0 once the period is over")
    func clamps() {
        #expect(Self.fields(Self.state(company: (130, 100), user: (30, 25))).state == #""company";r=0;t=3600, "user";r=0;t=3600"#)
        #expect(Self.fields(Self.state(), now: Self.end.addingTimeInterval(-0.2)).state == #""company";r=60;t=1, "user";r=13;t=1"#)
        #expect(Self.fields(Self.state(), now: Self.end.addingTimeInterval(5)).state == #""company";r=60;t=0, "user";r=13;t=0"#)
    }

    @Test("a feature's bounded windows (SPEC §8): feature.<id>.period and .user-day; a day is as long as the company's day (23 h at DST)")
    func featureWindows() {
        var state = Self.state(company: (40, nil), user: (12, nil))
        // Europe/Berlin on 2026-03-29: the clocks go forward, so the day is 23 hours long.
        let dayStart = UnitTestSupport.time("2026-03-28T23:00:00Z")
        let dayEnd = UnitTestSupport.time("2026-03-29T22:00:00Z")
        state.periodStart = UnitTestSupport.time("2026-03-01T00:00:00Z")
        state.periodEnd = UnitTestSupport.time("2026-04-01T00:00:00Z")
        state.feature = FeatureState(
            id: "analysis", name: "Analysis", refused: nil, message: nil, dayStart: dayStart, dayEnd: dayEnd,
            values: [(10, 50), (3, nil), (nil, nil), (5, 5)])
        let (policy, remaining) = Self.fields(state, now: UnitTestSupport.time("2026-03-29T21:30:00Z"))
        #expect(policy == #""feature.analysis.period";q=50;w=2678400, "feature.analysis.user-day";q=5;w=82800"#)
        #expect(remaining == #""feature.analysis.period";r=40;t=181800, "feature.analysis.user-day";r=0;t=1800"#)
    }

    @Test(
        "the four windows: read in the lock order, a window with neither count nor limit left out, the refusing one found, each policy named"
    )
    func featureState() {
        let feature = FeatureState(
            id: "chat", name: "Chat", refused: .init(.user, .period), message: "Ask sales.", dayStart: nil, dayEnd: nil,
            values: [(1, 10), (nil, nil), (4, 4), (2, nil)])
        #expect(
            feature.counters.map { $0.policy(feature: "chat") } == [
                "feature.chat.period", "feature.chat.user-period", "feature.chat.user-day",
            ])
        #expect(feature.counters.map(\.used) == [1, 4, 2] && feature.counters.map(\.limit) == [10, 4, nil])
        #expect(feature.refused?.kind == FeatureState.Kind(.user, .period) && feature.refused?.used == 4)
        let day = FeatureState.Counter(window: .day, scope: .company, used: 0, limit: 1)
        #expect(day.policy(feature: "chat") == "feature.chat.day")
        let end = UnitTestSupport.time("2026-12-01T00:00:00Z")
        #expect(feature.resetAt(day, periodEnd: end) == nil && feature.resetAt(feature.counters[0], periodEnd: end) == end)
        let missing = FeatureState(id: "x", name: "X", refused: .init(.company, .day), message: nil, dayStart: nil, dayEnd: nil, values: [])
        #expect(missing.counters.isEmpty && missing.refused == nil)
    }

    @Test("budgets (SPEC §11): company-cost and user-cost in micro-dollars, r = limit − used − held, never below 0; after caps")
    func costEntries() {
        var state = Self.state(company: (40, 100), user: (12, nil))
        state.cost = CostState(
            company: .init(used: 1_000_000, held: 250_000, limit: 5_000_000), user: .init(used: 10, held: 3, limit: 5), hold: 3)
        let (policy, remaining) = Self.fields(state)
        #expect(policy == #""company";q=100;w=2592000, "company-cost";q=5000000;w=2592000, "user-cost";q=5;w=2592000"#)
        #expect(remaining == #""company";r=60;t=3600, "company-cost";r=3750000;t=3600, "user-cost";r=0;t=3600"#)
        state.cost?.company?.limit = nil
        #expect(Self.fields(state).policy?.contains("company-cost") == false)
    }

    @Test("a refund gives the call's hold back to both held counters, never below 0; a call that held nothing changes nothing")
    func costRefund() {
        let held = CostState(company: .init(used: 5, held: 100, limit: nil), user: .init(used: 5, held: 30, limit: 50), hold: 40)
        let refunded = held.refunded()
        #expect(refunded.company?.held == 60 && refunded.user?.held == 0)
        #expect(refunded.company?.used == 5 && refunded.user?.limit == 50)
        let nothing = CostState(company: .init(used: 5, held: 100, limit: nil), user: nil, hold: nil)
        #expect(nothing.refunded() == nothing)
    }
}
