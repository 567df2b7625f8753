import Foundation
import Testing

@testable import CapGate

/// SPEC §14's decisions about a call's own windows that are made in Swift (Metering/RateState.swift):
/// a call whose hold alone is over a token window can never pass (a 400, not a 429), what a
/// call's end gives back, when a window has room again, and what a refund takes out.
@Suite("Rate windows: unpassable holds, ends, resets, refunds")
struct RateWindowTests {
    static let minute = UnitTestSupport.time("2026-11-01T10:15:00Z")
    static let limits = RateState.Limits(companyTPM: 80_000, userRPM: 30, userTPM: 50_000)

    static func state(
        refused: RateState.Window?, tokens: Int64?, feature: RateState.FeatureWindows? = nil, refusedFeature: Bool = false
    )
        -> RateState
    {
        RateState(
            limits: limits, minute: minute, counts: .init(userCalls: 3, userTokens: 1_000), feature: feature, refused: refused,
            refusedFeature: refusedFeature, tokens: tokens)
    }

    @Test("the windows by SPEC §14's names, in its order; a plan's set windows only")
    func names() {
        #expect(RateState.Window.allCases.map(\.rawValue) == ["company-rpm", "company-tpm", "user-rpm", "user-tpm", "user-concurrency"])
        #expect(Self.limits.windows == [.companyTPM, .userRPM, .userTPM])
        #expect(RateState.Limits().windows.isEmpty)
    }

    @Test(
        "a hold over the refusing token window's limit can never pass: that limit is named; a hold at the limit, or a call window, is a 429"
    )
    func unpassable() {
        #expect(Self.state(refused: .userTPM, tokens: 50_001).holdOverRefusingLimit == 50_000)
        #expect(Self.state(refused: .companyTPM, tokens: 90_000).holdOverRefusingLimit == 80_000)
        #expect(Self.state(refused: .userTPM, tokens: 50_000).holdOverRefusingLimit == nil)
        #expect(Self.state(refused: .userRPM, tokens: 999_999).holdOverRefusingLimit == nil)
        #expect(Self.state(refused: .userTPM, tokens: nil).holdOverRefusingLimit == nil)
        #expect(Self.state(refused: nil, tokens: 999_999).holdOverRefusingLimit == nil)
    }

    @Test("a feature's token window refusing: its own limit decides, not the plan's")
    func featureHold() {
        let feature = RateState.FeatureWindows(id: "chat", limits: .init(userTPM: 2_000), counts: .init(userTokens: 0))
        #expect(Self.state(refused: .userTPM, tokens: 2_001, feature: feature, refusedFeature: true).holdOverRefusingLimit == 2_000)
        #expect(Self.state(refused: .userTPM, tokens: 2_001, feature: feature, refusedFeature: false).holdOverRefusingLimit == nil)
        let noTokenWindow = RateState.FeatureWindows(id: "chat", limits: .init(userRPM: 5), counts: .init())
        #expect(Self.state(refused: .userTPM, tokens: 1, feature: noTokenWindow, refusedFeature: true).holdOverRefusingLimit == nil)
    }

    @Test(
        "a charged call's end: its slot where a concurrency limit is set, its token settlement where a token window is; a refusal, nothing")
    func ends() {
        #expect(Self.state(refused: nil, tokens: 10).end == RateState.End(slot: false, tokens: true))
        #expect(Self.state(refused: .userRPM, tokens: 10).end == .none)
        let slots = RateState(limits: .init(userConcurrency: 2), minute: Self.minute, counts: .init(userInFlight: 1))
        #expect(slots.end == RateState.End(slot: true, tokens: false))
        let featureSlots = RateState(
            limits: .init(), minute: Self.minute, counts: .init(),
            feature: .init(id: "a", limits: .init(companyTPM: 9, userConcurrency: 1), counts: .init()))
        #expect(featureSlots.end == RateState.End(slot: true, tokens: true))
        #expect(RateState(limits: .init(companyRPM: 10), minute: Self.minute, counts: .init()).end == .none)
    }

    @Test("room again: at the end of the call's UTC minute, or in a second for the calls in flight")
    func resets() {
        let state = Self.state(refused: .userRPM, tokens: 1)
        let now = UnitTestSupport.time("2026-11-01T10:15:42.500Z")
        for window in [RateState.Window.companyRPM, .companyTPM, .userRPM, .userTPM] {
            #expect(state.resetAt(window, now: now) == UnitTestSupport.time("2026-11-01T10:16:00Z"), "\(window)")
        }
        #expect(state.resetAt(.userConcurrency, now: now) == UnitTestSupport.time("2026-11-01T10:15:43.500Z"))
    }

    @Test("a refund takes the call's tokens and its slot out, never below 0, and leaves its calls counted (the provider saw it)")
    func refundCounts() {
        let counts = RateState.Counts(companyCalls: 7, companyTokens: 300, userCalls: 2, userTokens: 50, userInFlight: 0)
        let after = counts.without(tokens: 120)
        #expect(after == RateState.Counts(companyCalls: 7, companyTokens: 180, userCalls: 2, userTokens: 0, userInFlight: 0))
        #expect(RateState.Counts(userInFlight: 3).without(tokens: 5) == RateState.Counts(userInFlight: 2))
        #expect(RateState.Counts().without(tokens: 5) == RateState.Counts())
        let refunded = Self.state(refused: nil, tokens: 400).refunded()
        #expect(refunded.counts.userTokens == 600 && refunded.counts.userCalls == 3)
    }
}
