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
            // Cost as `capgate verify` counts it: a row's cost once it has a cost_source, its hold
            // while it has none. The lower time bound only lets the (company, time) index skip the
            // rows before the period (every row is written at its call's time, inside its period).
            let rows = try await connection.query(
                """
                SELECT l.model, count(*)::bigint,
                       coalesce(sum(l.input_tokens), 0)::bigint, coalesce(sum(l.output_tokens), 0)::bigint,
                       coalesce(sum(coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0)), 0)::bigint,
                       coalesce(sum(l.cache_read_tokens), 0)::bigint,
                       coalesce(sum(l.cost_micros) FILTER (WHERE l.cost_source IS NOT NULL), 0)::bigint,
                       coalesce(sum(l.hold_micros) FILTER (WHERE l.cost_source IS NULL), 0)::bigint
                  FROM usage_ledger l
                 WHERE l.company_id = \(company) AND l.period_id = \(id) AND l.created_at >= \(start) AND l.outcome = 'charged'
                 GROUP BY l.model
                 ORDER BY 7 DESC, l.model COLLATE "C" NULLS LAST
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
