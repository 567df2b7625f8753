import Foundation

/// Plan-period arithmetic, in UTC, in one place.
///
/// Period k of an anchor is `[anchor + k intervals, anchor + (k+1) intervals)`, each bound
/// computed from the anchor (never by chaining `+1 month`) and clamped to the last day of its
/// month: an anchor on Jan 31 10:00 gives Feb 28/29 10:00, then Mar 31 10:00.
public enum PeriodMath {
    /// A billing interval.
    public enum Interval: String, Sendable {
        case month, year
        var months: Int { self == .month ? 1 : 12 }
    }

    package static let calendar: Calendar = {
        var c = Calendar(identifier: .gregorian)
        c.timeZone = TimeZone(identifier: "UTC")!
        return c
    }()

    /// `anchor + months`, clamped to the end of the target month, keeping the time of day.
    public static func add(months: Int, to anchor: Date) -> Date {
        let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second, .nanosecond], from: anchor)
        let total = parts.year! * 12 + (parts.month! - 1) + months
        let year = total >= 0 ? total / 12 : (total - 11) / 12
        let month = total - year * 12 + 1
        let first = calendar.date(from: DateComponents(year: year, month: month, day: 1))!
        let days = calendar.range(of: .day, in: .month, for: first)!.count
        var target = DateComponents()
        target.year = year
        target.month = month
        target.day = min(parts.day!, days)
        target.hour = parts.hour
        target.minute = parts.minute
        target.second = parts.second
        target.nanosecond = parts.nanosecond
        return calendar.date(from: target)!
    }

    /// Bounds of period `k` of `anchor`.
    public static func bounds(anchor: Date, interval: Interval, index k: Int) -> (start: Date, end: Date) {
        (add(months: k * interval.months, to: anchor), add(months: (k + 1) * interval.months, to: anchor))
    }

    /// The period of `anchor` that contains `at` (k may be negative when `at` precedes the anchor).
    public static func period(containing at: Date, anchor: Date, interval: Interval) -> (start: Date, end: Date, index: Int) {
        let a = calendar.dateComponents([.year, .month], from: anchor)
        let b = calendar.dateComponents([.year, .month], from: at)
        var k = ((b.year! - a.year!) * 12 + (b.month! - a.month!)) / interval.months
        while true {
            let (start, end) = bounds(anchor: anchor, interval: interval, index: k)
            if at < start {
                k -= 1
            } else if at >= end {
                k += 1
            } else {
                return (start, end, k)
            }
        }
    }
}
