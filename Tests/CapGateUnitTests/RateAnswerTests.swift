import Foundation
import Testing

@testable import CapGate

/// SPEC §14's answers from a call's rate windows, without a database: the 429 (status, type,
/// Retry-After, `usage.rate`), the RateLimit entries of each window set, and a refund's counts.
@Suite("Rate windows: the 429 and the RateLimit fields")
struct RateAnswerTests {
    /// 20 s into a UTC minute.
    static let now = Date(timeIntervalSince1970: 1_800_000_000 - 1_800_000_000.truncatingRemainder(dividingBy: 60) + 20)
    static let minute = now.addingTimeInterval(-20)

    static func state(_ rate: RateState) -> UsageState {
        var state = RefusalAnswerTests.state(companyUsed: 1, companyLimit: nil, userUsed: 1, userLimit: nil)
        state.rate = rate
        return state
    }

    static let plan = RateState.Limits(companyRPM: 100, userRPM: 30, userTPM: 50_000, userConcurrency: 3)

    @Test("a plan window: 429 rate_limit_error, Retry-After to the minute's end, usage.rate of the refusing window, scope user")
    func planWindow() {
        let rate = RateState(
            limits: Self.plan, minute: Self.minute,
            counts: .init(companyCalls: 41, userCalls: 30, userTokens: 12_000, userInFlight: 2), refused: .userRPM, tokens: 2_000)
        let error = Responder.error(for: .rate(.userRPM), state: Self.state(rate), now: Self.now)
        #expect(error.status.code == 429)
        #expect(error.type == "rate_limit_error")
        #expect(error.headers[.retryAfter] == "40")
        #expect(error.message.contains("30 calls allowed this minute") && error.message.contains("Nothing was charged"))
        let usage = RefusalAnswerTests.usage(error)
        #expect(usage["scope"]?.stringValue == "user")
        let window = usage["rate"]
        #expect(window?["window"]?.stringValue == "user-rpm" && window?["feature"] == nil)
        #expect(window?["limit"]?.intValue == 30 && window?["used"]?.intValue == 30)
        #expect(window?["reset_at"]?.stringValue.flatMap(Timestamp.parseStrict) == Self.minute.addingTimeInterval(60))
        // Only the windows with a count: the company's rpm and the user's three (tpm, rpm, slots).
        #expect(
            error.headers[.rateLimitPolicy]
                == #""company-rpm";q=100;w=60, "user-rpm";q=30;w=60, "user-tpm";q=50000;w=60, "user-concurrency";q=3"#)
        #expect(
            error.headers[.rateLimit] == #""company-rpm";r=59;t=40, "user-rpm";r=0;t=40, "user-tpm";r=38000;t=40, "user-concurrency";r=1"#)
    }

    @Test("a company window refuses with scope company; the calls in flight retry after 1 s; a feature's window names the feature")
    func otherWindows() {
        let company = RateState(
            limits: Self.plan, minute: Self.minute, counts: .init(companyCalls: 100), refused: .companyRPM, tokens: 10)
        let companyError = Responder.error(for: .rate(.companyRPM), state: Self.state(company), now: Self.now)
        #expect(RefusalAnswerTests.usage(companyError)["scope"]?.stringValue == "company")
        #expect(companyError.message.hasPrefix("Your company has made its 100 calls"))

        let slots = RateState(
            limits: Self.plan, minute: Self.minute, counts: .init(companyCalls: 5, userCalls: 5, userTokens: 5, userInFlight: 3),
            refused: .userConcurrency, tokens: 10)
        let slotError = Responder.error(for: .rate(.userConcurrency), state: Self.state(slots), now: Self.now)
        #expect(slotError.headers[.retryAfter] == "1")
        #expect(RefusalAnswerTests.usage(slotError)["rate"]?["used"]?.intValue == 3)

        var feature = RateState(
            limits: .init(), minute: Self.minute, counts: .init(),
            feature: .init(id: "analysis", limits: .init(userRPM: 2), counts: .init(userCalls: 2)), refused: .userRPM,
            tokens: 10)
        feature.refusedFeature = true
        let featureError = Responder.error(for: .rate(.userRPM), state: Self.state(feature), now: Self.now)
        let window = RefusalAnswerTests.usage(featureError)["rate"]
        #expect(window?["feature"]?.stringValue == "analysis" && window?["limit"]?.intValue == 2)
        #expect(featureError.headers[.rateLimitPolicy] == #""feature.analysis.user-rpm";q=2;w=60"#)
    }

    @Test(
        "a refund after the provider's error answer takes its tokens and its slot out, the call stays counted; a slot makes its end awaited, a token window its settlement count, call windows nothing"
    )
    func refundAndEnd() {
        let rate = RateState(
            limits: Self.plan, minute: Self.minute,
            counts: .init(companyCalls: 4, companyTokens: nil, userCalls: 2, userTokens: 3_000, userInFlight: 1), tokens: 1_000)
        let back = rate.refunded()
        #expect(back.counts == .init(companyCalls: 4, userCalls: 2, userTokens: 2_000, userInFlight: 0))
        #expect(rate.end == .init(slot: true, tokens: true))
        #expect(RateState(limits: .init(companyRPM: 5, userRPM: 5), minute: Self.minute, counts: .init()).end == .none)
        #expect(RateState(limits: .init(userTPM: 5_000), minute: Self.minute, counts: .init()).end == .init(slot: false, tokens: true))
        let featureSlot = RateState(
            limits: .init(companyTPM: 9_000), minute: Self.minute, counts: .init(),
            feature: .init(id: "analysis", limits: .init(userConcurrency: 2), counts: .init()))
        #expect(featureSlot.end == .init(slot: true, tokens: true))
        var refused = rate
        refused.refused = .userRPM
        #expect(refused.end == .none)
    }

    @Test("the dry run's window: one call more than a minute's calls, a full token window, every slot taken; in SPEC §14's order")
    func refusalNow() {
        func state(_ counts: RateState.Counts) -> RateState { RateState(limits: Self.plan, minute: Self.minute, counts: counts) }
        #expect(state(.init(companyCalls: 99, userCalls: 29, userTokens: 49_999, userInFlight: 2)).refusalNow() == nil)
        #expect(state(.init(companyCalls: 100, userCalls: 30)).refusalNow()?.window == .companyRPM)
        #expect(state(.init(companyCalls: 10, userCalls: 30)).refusalNow()?.window == .userRPM)
        #expect(state(.init(userCalls: 1, userTokens: 50_000)).refusalNow()?.window == .userTPM)
        #expect(state(.init(userCalls: 1, userTokens: 10, userInFlight: 3)).refusalNow()?.window == .userConcurrency)
        #expect(RateState(limits: .init(), minute: Self.minute, counts: .init(userCalls: 1_000)).refusalNow() == nil)
        #expect(state(.init(companyCalls: 100)).refusalNow()?.feature == false)
    }

    @Test("the dry run with a feature's windows: the company's (plan, then feature) before the user's (plan, then feature)")
    func refusalNowWithFeature() {
        func state(plan: RateState.Counts, feature: RateState.Counts) -> RateState {
            RateState(
                limits: .init(companyRPM: 100, userRPM: 30), minute: Self.minute, counts: plan,
                feature: .init(id: "analysis", limits: .init(companyRPM: 10, userRPM: 2, userConcurrency: 1), counts: feature))
        }
        #expect(state(plan: .init(companyCalls: 9, userCalls: 1), feature: .init(companyCalls: 9, userCalls: 1)).refusalNow() == nil)
        let featureCompany = state(plan: .init(companyCalls: 10, userCalls: 30), feature: .init(companyCalls: 10, userCalls: 2))
        #expect(featureCompany.refusalNow()?.window == .companyRPM && featureCompany.refusalNow()?.feature == true)
        let planUser = state(plan: .init(companyCalls: 10, userCalls: 30), feature: .init(companyCalls: 1, userCalls: 2))
        #expect(planUser.refusalNow()?.window == .userRPM && planUser.refusalNow()?.feature == false)
        let featureUser = state(plan: .init(companyCalls: 10, userCalls: 3), feature: .init(companyCalls: 1, userCalls: 2))
        #expect(featureUser.refusalNow()?.window == .userRPM && featureUser.refusalNow()?.feature == true)
        let featureSlots = state(plan: .init(), feature: .init(userInFlight: 1))
        #expect(featureSlots.refusalNow()?.window == .userConcurrency && featureSlots.refusalNow()?.feature == true)
    }
}
