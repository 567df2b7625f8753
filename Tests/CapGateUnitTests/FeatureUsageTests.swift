import Foundation
import Testing

@testable import CapGate

/// A plan's feature as the usage reads show it and as a dry run checks it (SPEC §8,
/// Metering/FeatureUsage.swift): four windows (company period and day, user period and day),
/// `null` limits when unlimited, a disabled feature admitting nothing, and the first window in
/// the admission's lock order that more units would exceed.
@Suite("Feature windows in usage reads and checks")
struct FeatureUsageTests {
    static let alice = UUID()
    static let bob = UUID()
    static let dayStart = UnitTestSupport.time("2026-11-14T23:00:00Z")
    static let dayEnd = UnitTestSupport.time("2026-11-15T23:00:00Z")
    static let periodEnd = UnitTestSupport.time("2026-12-01T00:00:00Z")

    static func feature(
        enabled: Bool = true, daily: Int64? = 20, period: Int64? = 100, userDaily: Int64? = 5, userPeriod: Int64? = nil,
        company: FeatureUsage.Used = .init(day: 12, period: 70)
    ) -> FeatureUsage {
        FeatureUsage(
            id: "analysis", name: "Analysis", enabled: enabled, dailyLimit: daily, periodLimit: period, userDailyLimit: userDaily,
            userPeriodLimit: userPeriod, dayStart: dayStart, dayEnd: dayEnd, periodEnd: periodEnd, company: company,
            users: [alice: .init(day: 4, period: 9)])
    }

    @Test("a caller's entry: the company's day and period, the caller's own, each reset at the company's midnight or the period's end")
    func callerEntry() {
        #expect(
            Self.feature().json(user: Self.alice).serialized()
                == #"{"id":"analysis","name":"Analysis","enabled":true,"day":{"used":12,"limit":20,"remaining":8,"reset_at":"2026-11-15T23:00:00Z"},"period":{"used":70,"limit":100,"remaining":30,"reset_at":"2026-12-01T00:00:00Z"},"user_day":{"used":4,"limit":5,"remaining":1,"reset_at":"2026-11-15T23:00:00Z"},"user_period":{"used":9,"limit":null,"remaining":null,"reset_at":"2026-12-01T00:00:00Z"}}"#
        )
    }

    @Test("a user with no counter yet has used 0; the company level has no user windows; a user's own entry has only theirs")
    func levels() {
        let bob = Self.feature().json(user: Self.bob)
        #expect(bob["user_day"]?["used"] == .int(0) && bob["user_day"]?["remaining"] == .int(5))
        let company = Self.feature().json(user: nil)
        #expect(company["user_day"] == .null && company["user_period"] == .null && company["day"]?["used"] == .int(12))
        let own = Self.feature().userJSON(Self.alice)
        #expect(own["day"] == nil && own["period"] == nil && own["user_day"]?["used"] == .int(4))
    }

    @Test("a disabled feature admits nothing: every window shows limit 0 and remaining 0, unlimited ones too")
    func disabled() {
        let entry = Self.feature(enabled: false, daily: nil).json(user: Self.alice)
        #expect(entry["enabled"] == .bool(false))
        for window in ["day", "period", "user_day", "user_period"] {
            #expect(entry[window]?["limit"] == .int(0) && entry[window]?["remaining"] == .int(0), "\(window)")
        }
    }

    @Test(
        "a check: units up to each limit pass; the first window exceeded in the lock order refuses (company period, day, user period, day)")
    func check() {
        let feature = Self.feature(userPeriod: 10)
        #expect(feature.check(units: 1, user: Self.alice).refused == nil)
        #expect(feature.check(units: 2, user: Self.alice).refused?.kind == FeatureState.Kind(.user, .period))
        #expect(feature.check(units: 5, user: Self.bob).refused == nil)
        #expect(feature.check(units: 6, user: Self.bob).refused?.kind == FeatureState.Kind(.user, .day))
        #expect(feature.check(units: 9, user: Self.bob).refused?.kind == FeatureState.Kind(.company, .day))
        #expect(feature.check(units: 31, user: Self.bob).refused?.kind == FeatureState.Kind(.company, .period))
        let unlimited = Self.feature(daily: nil, period: nil, userDaily: nil)
        #expect(unlimited.check(units: 1_000_000, user: Self.alice).refused == nil)
    }

    @Test("a check reports every window with its count, so the RateLimit fields name each bounded one")
    func checkWindows() {
        let state = Self.feature().check(units: 1, user: Self.bob)
        #expect(state.counters.count == 4)
        #expect(state.counters.map(\.used) == [70, 12, 0, 0] && state.counters.map(\.limit) == [100, 20, nil, 5])
        #expect(state.dayEnd == Self.dayEnd && state.id == "analysis")
    }
}
