import Foundation
import PostgresNIO

/// The console's daily read (`GET /admin/v1/companies/{id}/usage/daily`, SPEC §10).
extension UsageStore {
    /// A `from`/`to` value: a day `YYYY-MM-DD` (in the company's zone) or an ISO-8601 time (its
    /// day in the company's zone).
    public enum DayBound: Sendable {
        case date(String)
        case time(Date)
    }

    /// Units per day in the company's zone, every day of the range (0 where nothing was
    /// charged), split by feature. Default range: the current period's first day (or, with no
    /// period or a `to` before it, the 30 days ending at `to`) to today. Read from the ledger's rollups
    /// (migration 0028: its charged rows summed per quarter hour, and a zone's day is a whole number
    /// of quarter hours), so it costs O(days) whatever the ledger holds; a group whose calls were
    /// all refunded is no group, as no charged row was.
    /// The range and the ledger are read in one snapshot (``Database/snapshot(_:)``), so
    /// "today" and the current period are those of the rows counted.
    public func daily(company: UUID, from: DayBound?, to: DayBound?) async throws -> [DailyUsage] {
        func date(_ day: DayBound?) -> String? { if case .date(let d) = day { d } else { nil } }
        func time(_ day: DayBound?) -> Date? { if case .time(let t) = day { t } else { nil } }
        let (fromDate, fromTime, toDate, toTime) = (date(from), time(from), date(to), time(to))
        return try await database.snapshot { connection in
            let bounds = try await connection.query(
                """
                WITH z AS (SELECT time_zone AS tz, (now() AT TIME ZONE time_zone)::date AS today FROM companies WHERE id = \(company)),
                     e AS (
                        SELECT z.tz, coalesce(\(toDate)::date, (\(toTime)::timestamptz AT TIME ZONE z.tz)::date, z.today) AS d1,
                               (SELECT (p.started_at AT TIME ZONE z.tz)::date FROM plan_periods p
                                 WHERE p.company_id = \(company) AND p.started_at <= now() AND p.ends_at > now()
                                 ORDER BY p.started_at DESC LIMIT 1) AS period_day
                          FROM z),
                     b AS (
                        SELECT e.tz, e.d1,
                               coalesce(\(fromDate)::date, (\(fromTime)::timestamptz AT TIME ZONE e.tz)::date,
                                        CASE WHEN e.period_day <= e.d1 THEN e.period_day ELSE e.d1 - 29 END) AS d0
                          FROM e)
                SELECT tz, to_char(d0, 'YYYY-MM-DD'), to_char(d1, 'YYYY-MM-DD'), (d1 - d0)::bigint FROM b
                """, logger: logger)
            guard let (tz, d0, d1, span) = try await bounds.decode((String, String, String, Int64).self).collect().first else {
                return []
            }
            guard span >= 0 else { throw GatewayError.invalidRequest("'from' must not be after 'to'.") }
            guard span < 400 else { throw GatewayError.invalidRequest("A daily read spans at most 400 days; narrow 'from' and 'to'.") }
            let rows = try await connection.query(
                """
                SELECT to_char(d.day, 'YYYY-MM-DD'), s.feature, coalesce(s.units, 0)::bigint
                  FROM generate_series(\(d0)::date, \(d1)::date, interval '1 day') AS d(day)
                  LEFT JOIN (
                        SELECT (r.bucket AT TIME ZONE \(tz))::date AS day, r.feature, sum(r.units) AS units
                          FROM usage_rollups_all r
                         WHERE r.company_id = \(company)
                           AND r.bucket >= (\(d0)::date::timestamp AT TIME ZONE \(tz))
                           AND r.bucket < ((\(d1)::date + 1)::timestamp AT TIME ZONE \(tz))
                         GROUP BY 1, 2
                        HAVING sum(r.calls) <> 0) s ON s.day = d.day::date
                 ORDER BY d.day, s.feature NULLS FIRST
                """, logger: logger)
            var days: [DailyUsage] = []
            for try await (date, feature, units) in rows.decode((String, String?, Int64).self) {
                if days.last?.date != date { days.append(DailyUsage(date: date, units: 0, features: [:])) }
                days[days.count - 1].units += units
                if let feature { days[days.count - 1].features[feature] = units }
            }
            return days
        }
    }
}
