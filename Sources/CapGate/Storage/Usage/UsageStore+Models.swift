import Foundation
import PostgresNIO

/// `GET /admin/v1/companies/{id}/usage/models` (SPEC §11): tokens and cost per model in one
/// period.
extension UsageStore {
    /// Which period: the one containing now, or the one that started on a day.
    public enum PeriodChoice: Sendable, Equatable {
        case current
        /// A period's start date as the history writes it (`period.start`, UTC): `YYYY-MM-DD`.
        case startingOn(String)

        /// `YYYY-MM-DD` naming a real day (`2026-02-30` is not one); nil for anything else.
        public init?(day text: String) {
            let parts = text.split(separator: "-", omittingEmptySubsequences: false)
            guard text.utf8.count == 10, parts.count == 3, parts[0].count == 4, parts[1].count == 2, parts[2].count == 2,
                parts.allSatisfy({ $0.utf8.allSatisfy { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") } }),
                let year = Int(parts[0]), let month = Int(parts[1]), let day = Int(parts[2]), year >= 1, (1...12).contains(month)
            else { return nil }
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(identifier: "UTC")!
            guard let date = calendar.date(from: DateComponents(year: year, month: month, day: day)),
                calendar.component(.day, from: date) == day, calendar.component(.month, from: date) == month
            else { return nil }
            self = .startingOn(text)
        }
    }

    /// The company's charged calls in the chosen period, grouped by the request's `model`; nil
    /// when no period is that one (none contains now, or none started that day). Of several
    /// periods that started the same day (a plan changed on it), the last to start is the one.
    /// The period and its rows are read in one snapshot (``Database/snapshot(_:)``). As the
    /// usage read, asking for the current period first moves a company whose period ended into
    /// the one containing `at` (`capgate_roll_company`).
    public func models(company: UUID, period choice: PeriodChoice, at: Date = Date()) async throws -> PeriodModels? {
        if let read = try await modelsRead(company: company, period: choice, at: at) { return read }
        guard choice == .current else { return nil }
        let change = try await database.write { connection in
            try await connection.query("SELECT capgate_roll_company(\(company), \(at))", logger: logger).decode(String.self).collect().first
        }
        guard let change, change != "none" else { return nil }
        return try await modelsRead(company: company, period: choice, at: at)
    }

    func modelsRead(company: UUID, period choice: PeriodChoice, at: Date) async throws -> PeriodModels? {
        let day: String? = if case .startingOn(let d) = choice { d } else { nil }
        return try await database.snapshot { connection in
            let periods = try await connection.query(
                """
                SELECT pp.id, pp.started_at, pp.ends_at FROM plan_periods pp
                 WHERE pp.company_id = \(company)
                   AND CASE WHEN \(day)::text IS NULL THEN pp.started_at <= \(at) AND pp.ends_at > \(at)
                            ELSE pp.started_at >= (\(day)::date::timestamp AT TIME ZONE 'UTC')
                             AND pp.started_at < ((\(day)::date + 1)::timestamp AT TIME ZONE 'UTC') END
                 ORDER BY pp.started_at DESC
                 LIMIT 1
                """, logger: logger)
            guard let (id, start, end) = try await periods.decode((Int64, Date, Date).self).collect().first else { return nil }
            // From the ledger's rollups (migration 0028: O(quarter hours of the period), not O(calls)),
            // cost as `capgate verify` counts it: a row's cost once it has a cost_source, its hold
            // while it has none. The time bounds only let the rollups' (company, quarter hour) index
            // skip other periods' rows (every row is written at its call's time, inside its period).
            let rows = try await connection.query(
                """
                SELECT r.model, sum(r.calls)::bigint, sum(r.input_tokens)::bigint, sum(r.output_tokens)::bigint,
                       sum(r.cache_write_tokens)::bigint, sum(r.cache_read_tokens)::bigint, sum(r.cost_micros)::bigint,
                       sum(r.held_micros)::bigint
                  FROM usage_rollups_all r
                 WHERE r.company_id = \(company) AND r.period_id = \(id)
                   AND r.bucket >= date_bin('15 minutes', \(start)::timestamptz, timestamptz '2000-01-01 00:00:00+00')
                   AND r.bucket < \(end)
                 GROUP BY r.model
                HAVING sum(r.calls) <> 0
                 ORDER BY 7 DESC, r.model COLLATE "C" NULLS LAST
                """, logger: logger)
            var models: [ModelUsage] = []
            for try await r in rows.decode((String?, Int64, Int64, Int64, Int64, Int64, Int64, Int64).self) {
                models.append(
                    ModelUsage(
                        model: r.0, calls: r.1, inputTokens: r.2, outputTokens: r.3, cacheWriteTokens: r.4, cacheReadTokens: r.5,
                        cost: Micros(r.6), held: Micros(r.7)))
            }
            return PeriodModels(start: start, end: end, models: models)
        }
    }
}
