import CapGate
import Foundation

/// The console's daily read from the ledger: charged units per day of the company's zone, every
/// day of the range (0 where nothing was charged), split by feature; the range's defaults and
/// limits as PostgreSQL's (the current period's first day, else the 30 days ending at `to`, to
/// today; at most 400 days; `from` after `to` is 400).
extension InMemoryUsage {
    package func daily(company: UUID, from: UsageStore.DayBound?, to: UsageStore.DayBound?) async throws -> [DailyUsage] {
        guard let row = tenants.company(company), let zone = TimeZone(identifier: row.timeZone) else { return [] }
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = zone
        let now = Date()
        let last = Self.start(of: to, calendar) ?? calendar.startOfDay(for: now)
        let periodDay = tenants.period(of: company, at: now).map { calendar.startOfDay(for: $0.start) }
        let defaultFirst = periodDay.flatMap { $0 <= last ? $0 : nil } ?? calendar.date(byAdding: .day, value: -29, to: last)!
        let first = Self.start(of: from, calendar) ?? defaultFirst
        let span = calendar.dateComponents([.day], from: first, to: last).day!
        guard span >= 0 else { throw GatewayError.invalidRequest("'from' must not be after 'to'.") }
        guard span < 400 else { throw GatewayError.invalidRequest("A daily read spans at most 400 days; narrow 'from' and 'to'.") }
        var days: [String: DailyUsage] = [:]
        for call in tenants.calls where call.companyID == company && !call.refunded {
            let date = Self.day(call.at, in: zone)
            days[date, default: DailyUsage(date: date, units: 0, features: [:])].units += Int64(call.units)
            if let feature = call.feature { days[date]!.features[feature, default: 0] += Int64(call.units) }
        }
        return (0...span).map { offset in
            let date = Self.day(calendar.date(byAdding: .day, value: offset, to: first)!, in: zone)
            return days[date] ?? DailyUsage(date: date, units: 0, features: [:])
        }
    }

    /// The first instant of a bound's day in the company's zone.
    static func start(of bound: UsageStore.DayBound?, _ calendar: Calendar) -> Date? {
        switch bound {
        case .none:
            return nil
        case .time(let time):
            return calendar.startOfDay(for: time)
        case .date(let text):
            let parts = text.split(separator: "-").compactMap { Int($0) }
            guard parts.count == 3 else { return nil }
            return calendar.date(from: DateComponents(year: parts[0], month: parts[1], day: parts[2]))
        }
    }
}
