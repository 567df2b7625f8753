import Foundation
import Testing

@testable import CapGate

/// Plan periods (SPEC §6, Metering/PeriodMath.swift): `anchor + k months`, clamped to the
/// month's last day and computed from the anchor, never by chaining; half-open windows
/// `[start, end)` that tile time; a time before the anchor, or years after it, still finds its
/// period in one call.
@Suite("Period math: anchored, clamped, half-open")
struct PeriodMathTests {
    static func at(_ text: String) -> Date { UnitTestSupport.time(text) }

    static func starts(_ anchor: Date, _ interval: PeriodMath.Interval, _ indices: some Sequence<Int>) -> [Date] {
        indices.map { PeriodMath.bounds(anchor: anchor, interval: interval, index: $0).start }
    }

    @Test("adding months backwards clamps the same way, across year ends and leap days")
    func backwards() {
        #expect(PeriodMath.add(months: -1, to: Self.at("2026-03-31T10:00:00Z")) == Self.at("2026-02-28T10:00:00Z"))
        #expect(PeriodMath.add(months: -1, to: Self.at("2024-03-31T10:00:00Z")) == Self.at("2024-02-29T10:00:00Z"))
        #expect(PeriodMath.add(months: -1, to: Self.at("2026-01-15T08:00:00Z")) == Self.at("2025-12-15T08:00:00Z"))
        #expect(PeriodMath.add(months: -13, to: Self.at("2026-01-31T00:00:00Z")) == Self.at("2024-12-31T00:00:00Z"))
        #expect(PeriodMath.add(months: -12, to: Self.at("2024-02-29T12:00:00Z")) == Self.at("2023-02-28T12:00:00Z"))
        #expect(PeriodMath.add(months: -24, to: Self.at("2026-06-30T00:00:00Z")) == Self.at("2024-06-30T00:00:00Z"))
    }

    @Test("adding months forwards: the day kept where the month has it, else the month's last day; century leap rules")
    func forwards() {
        let anchor = Self.at("2026-01-31T10:00:00Z")
        #expect(PeriodMath.add(months: 0, to: anchor) == anchor)
        #expect(PeriodMath.add(months: 11, to: anchor) == Self.at("2026-12-31T10:00:00Z"))
        #expect(PeriodMath.add(months: 13, to: anchor) == Self.at("2027-02-28T10:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.at("2026-05-31T00:00:00Z")) == Self.at("2026-06-30T00:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.at("2026-01-28T00:00:00Z")) == Self.at("2026-02-28T00:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.at("2100-01-29T00:00:00Z")) == Self.at("2100-02-28T00:00:00Z"))
        #expect(PeriodMath.add(months: 1, to: Self.at("2000-01-30T00:00:00Z")) == Self.at("2000-02-29T00:00:00Z"))
        #expect(PeriodMath.add(months: 1200, to: Self.at("2000-02-29T00:00:00Z")) == Self.at("2100-02-28T00:00:00Z"))
    }

    @Test("the time of day is kept to the millisecond through the clamp")
    func timeOfDay() {
        let anchor = Self.at("2026-01-31T23:59:59.500Z")
        let next = PeriodMath.add(months: 1, to: anchor)
        #expect(abs(next.timeIntervalSince(Self.at("2026-02-28T23:59:59.500Z"))) < 0.000_5)
        #expect(PeriodMath.add(months: 1, to: Self.at("2026-03-01T00:00:00Z")) == Self.at("2026-04-01T00:00:00Z"))
    }

    @Test("period k of an anchor on the 31st: Jan 31, Feb 28, Mar 31, Apr 30, May 31, never Mar 28; k = -1 is December")
    func monthBounds() {
        let anchor = Self.at("2026-01-31T10:00:00Z")
        let expected = ["2026-01-31", "2026-02-28", "2026-03-31", "2026-04-30", "2026-05-31", "2026-06-30"].map {
            Self.at($0 + "T10:00:00Z")
        }
        #expect(Self.starts(anchor, .month, 0...5) == expected)
        let second = PeriodMath.bounds(anchor: anchor, interval: .month, index: 1)
        #expect(second.start == expected[1] && second.end == expected[2])
        let before = PeriodMath.bounds(anchor: anchor, interval: .month, index: -1)
        #expect(before.start == Self.at("2025-12-31T10:00:00Z") && before.end == anchor)
    }

    @Test("a yearly period from Feb 29 ends on Feb 28 in common years and on Feb 29 in leap years")
    func yearBounds() {
        let anchor = Self.at("2028-02-29T00:00:00Z")
        #expect(
            Self.starts(anchor, .year, 0...4)
                == ["2028-02-29", "2029-02-28", "2030-02-28", "2031-02-28", "2032-02-29"].map {
                    Self.at($0 + "T00:00:00Z")
                })
        #expect(PeriodMath.bounds(anchor: anchor, interval: .year, index: 0).end == Self.at("2029-02-28T00:00:00Z"))
    }

    @Test("periods tile time: each end is the next start, 28 to 31 days long, for anchors on the 28th to the 31st")
    func tiling() {
        for day in 28...31 {
            let anchor = Self.at("2024-01-\(day)T06:30:00Z")
            for k in -24..<120 {
                let this = PeriodMath.bounds(anchor: anchor, interval: .month, index: k)
                let next = PeriodMath.bounds(anchor: anchor, interval: .month, index: k + 1)
                #expect(this.end == next.start, "day \(day), k \(k)")
                let days = this.end.timeIntervalSince(this.start) / 86_400
                #expect((28...31).contains(days), "day \(day), k \(k): \(days)")
            }
        }
    }

    @Test("the period containing a time is half-open: its start is in it, its end is the next period's")
    func halfOpen() {
        let anchor = Self.at("2026-01-31T10:00:00Z")
        func index(_ text: String) -> Int { PeriodMath.period(containing: Self.at(text), anchor: anchor, interval: .month).index }
        #expect(index("2026-01-31T10:00:00Z") == 0)
        #expect(index("2026-02-28T09:59:59Z") == 0)
        #expect(index("2026-02-28T10:00:00Z") == 1)
        #expect(index("2026-03-31T09:59:59.999Z") == 1)
        #expect(index("2026-03-31T10:00:00Z") == 2)
        let found = PeriodMath.period(containing: Self.at("2026-03-01T00:00:00Z"), anchor: anchor, interval: .month)
        #expect(found.start == Self.at("2026-02-28T10:00:00Z") && found.end == Self.at("2026-03-31T10:00:00Z"))
    }

    @Test("a time before the anchor is in a negative period; years of missed months are caught up in one call")
    func farAway() {
        let anchor = Self.at("2026-01-31T10:00:00Z")
        let before = PeriodMath.period(containing: Self.at("2025-12-31T09:59:59Z"), anchor: anchor, interval: .month)
        #expect(before.index == -2 && before.start == Self.at("2025-11-30T10:00:00Z") && before.end == Self.at("2025-12-31T10:00:00Z"))
        let later = PeriodMath.period(containing: Self.at("2031-07-15T00:00:00Z"), anchor: anchor, interval: .month)
        #expect(later.index == 65 && later.start == Self.at("2031-06-30T10:00:00Z") && later.end == Self.at("2031-07-31T10:00:00Z"))
        let yearly = Self.at("2024-02-29T00:00:00Z")
        let inYear = PeriodMath.period(containing: Self.at("2027-03-01T00:00:00Z"), anchor: yearly, interval: .year)
        #expect(inYear.index == 3 && inYear.start == Self.at("2027-02-28T00:00:00Z") && inYear.end == Self.at("2028-02-29T00:00:00Z"))
        let lastDay = PeriodMath.period(containing: Self.at("2027-02-27T23:59:59Z"), anchor: yearly, interval: .year)
        #expect(lastDay.index == 2 && lastDay.start == Self.at("2026-02-28T00:00:00Z"))
    }

    @Test("billing intervals by name (SPEC §5: month or year); any other spelling is none")
    func intervals() {
        #expect(PeriodMath.Interval(rawValue: "month") == .month && PeriodMath.Interval(rawValue: "year") == .year)
        for text in ["", "Month", "YEAR", "week", "monthly", "annual"] {
            #expect(PeriodMath.Interval(rawValue: text) == nil, "\(text)")
        }
    }
}
