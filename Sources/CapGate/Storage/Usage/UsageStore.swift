import Foundation
import Logging
import PostgresNIO

/// Usage reads for company admins and the operator (SPEC §4).
public struct UsageStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// Past periods (ended by `at`), newest first, each with plan, bounds, used and limit, and the
    /// company's cost against the plan's `monthly_company_budget` (whatever `feature` says). The
    /// current period is `GET …/usage`. With `feature`, `used` and `limit` are that feature's in
    /// the period (its company period counter, 0 when none; the limit is the plan's entitlement
    /// `period_limit` as it is now, null when unlimited, 0 when the plan has it not or disabled).
    public func history(company: UUID, periods: Int, feature: String? = nil, at: Date = Date()) async throws -> [PeriodUsage] {
        let limit = Int64(periods)
        return try await database.run { client in
            var out: [PeriodUsage] = []
            let rows = try await client.query(
                """
                SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at,
                       CASE WHEN \(feature)::text IS NULL THEN COALESCE(cu.used, 0) ELSE COALESCE(fu.used, 0) END,
                       CASE WHEN \(feature)::text IS NULL THEN pl.monthly_company_cap
                            WHEN e.enabled THEN e.period_limit ELSE 0 END,
                       COALESCE(cu.cost_used, 0), COALESCE(cu.cost_held, 0), pl.monthly_company_budget
                  FROM plan_periods pp JOIN plans pl ON pl.id = pp.plan_id
                  LEFT JOIN company_usage cu ON cu.company_id = pp.company_id AND cu.period_id = pp.id
                  LEFT JOIN company_feature_usage fu ON fu.company_id = pp.company_id AND fu.feature_id = \(feature)::text
                        AND fu.span = 'period' AND fu.starts_at = pp.started_at
                  LEFT JOIN plan_features e ON e.plan_id = pp.plan_id AND e.feature_id = \(feature)::text
                 WHERE pp.company_id = \(company) AND pp.ends_at <= \(at)
                 ORDER BY pp.started_at DESC
                 LIMIT \(limit)
                """,
                logger: logger
            )
            for try await (_, plan, name, start, end, used, cap, costUsed, costHeld, budget) in rows.decode(
                (Int64, String, String, Date, Date, Int64, Int64?, Int64, Int64, Int64?).self)
            {
                out.append(
                    PeriodUsage(
                        start: start, end: end, planID: plan, planName: name, used: used, limit: cap, feature: feature,
                        cost: CostCounter(used: costUsed, held: costHeld, limit: budget)))
            }
            return out
        }
    }

    /// One ledger row, with the bounds of the period it counts in.
    public struct Event: Sendable {
        public var id: Int64
        public var createdAt: Date
        public var companyID: UUID
        public var userID: UUID
        public var periodStart: Date
        public var periodEnd: Date
        public var units: Int32
        public var inputTokens: Int64?
        public var outputTokens: Int64?
        public var method: String
        public var route: String
        public var model: String?
        public var feature: String?
        public var outcome: String
        public var upstreamStatus: Int32?
        public var requestID: String
        public var idempotencyKey: String?
        /// Whether the provider's answer was recorded (see ``UnsettledCharges/State``).
        public var settlement: UnsettledCharges.State
        /// Cache writes, 5-minute and 1-hour together (nil when the answer reported neither).
        public var cacheWriteTokens: Int64? = nil
        public var cacheReadTokens: Int64? = nil
        /// What admission held for the call (nil: nothing was held).
        public var hold: Micros? = nil
        /// What the settled call cost (nil: not settled, or not priced).
        public var cost: Micros? = nil
        /// `usage` (the provider's usage priced it), `hold` (charged its hold), nil (open, or unpriced).
        public var costSource: String? = nil

        /// The first twelve columns as before the rest were added; new columns go at the end.
        static let csvHeader =
            "id,time,user_id,units,input_tokens,output_tokens,method,route,model,outcome,upstream_status,request_id,"
            + "company_id,period_start,period_end,feature,idempotency_key,settlement,"
            + "cache_write_tokens,cache_read_tokens,hold_usd,cost_usd,cost_source\n"

        var csvLine: String {
            let fields: [String] = [
                String(id), Timestamp.format(createdAt), userID.uuidString.lowercased(), String(units),
                inputTokens.map(String.init) ?? "", outputTokens.map(String.init) ?? "", method, route, model ?? "",
                outcome, upstreamStatus.map(String.init) ?? "", requestID, companyID.uuidString.lowercased(),
                Timestamp.format(periodStart), Timestamp.format(periodEnd), feature ?? "", idempotencyKey ?? "",
                settlement.rawValue, cacheWriteTokens.map(String.init) ?? "", cacheReadTokens.map(String.init) ?? "",
                hold?.decimal ?? "", cost?.decimal ?? "", costSource ?? "",
            ]
            return fields.map(Self.csvField).joined(separator: ",") + "\n"
        }

        /// One CSV cell (RFC 4180 quoting). Client-controlled text (route, model, idempotency
        /// key) reaches these cells, so a cell a spreadsheet would run as a formula (first
        /// character `=`, `+`, `-`, `@`, TAB or CR) is neutralised: a `'` in front, inside quotes.
        /// CapGate's own numeric columns never start with one of these.
        static func csvField(_ s: String) -> String {
            if let first = s.unicodeScalars.first, "=+-@\t\r".unicodeScalars.contains(first) {
                return "\"'" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            }
            // By scalar: "\r\n" is one Character, equal to neither "\r" nor "\n".
            if s.unicodeScalars.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" || $0 == "\t" }) {
                return "\"" + s.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            }
            return s
        }
    }

    /// Ledger rows in `[from, to)` after the keyset cursor (row id), oldest first, only those of
    /// `feature` when given; a charge with no settlement is `unsettled` once older than `grace`
    /// seconds at `now`.
    public func events(
        company: UUID, from: Date, to: Date, after cursor: Int64, limit: Int, feature: String? = nil, newestFirst: Bool = false,
        now: Date = Date(), grace: TimeInterval = UnsettledCharges.defaultGrace
    ) async throws -> [Event] {
        let limit = Int64(limit)
        // Newest first pages backwards: the cursor is the last (smallest) id of the page before.
        let (comparison, order) = newestFirst ? ("<", "l.id DESC") : (">", "l.id")
        return try await database.run { client in
            let rows = try await client.query(
                """
                SELECT l.id, l.created_at, l.user_id, pp.started_at, pp.ends_at, l.units, l.input_tokens, l.output_tokens,
                       l.method, l.route, l.model, l.feature, l.outcome, l.upstream_status, l.request_id, l.idempotency_key,
                       l.settled_at,
                       CASE WHEN l.cache_write_5m_tokens IS NOT NULL OR l.cache_write_1h_tokens IS NOT NULL
                            THEN coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0) END AS cache_write_tokens,
                       l.cache_read_tokens, l.hold_micros, l.cost_micros, l.cost_source
                  FROM usage_ledger l
                  JOIN plan_periods pp ON pp.company_id = l.company_id AND pp.id = l.period_id
                 WHERE l.company_id = \(company) AND l.created_at >= \(from) AND l.created_at < \(to) AND l.id \(unescaped: comparison) \(cursor)
                   AND (\(feature)::text IS NULL OR l.feature = \(feature)::text)
                 ORDER BY \(unescaped: order)
                 LIMIT \(limit)
                """,
                logger: logger
            )
            var out: [Event] = []
            for try await row in rows {
                out.append(try Event(row: row.makeRandomAccess(), company: company, now: now, grace: grace))
            }
            return out
        }
    }

    /// The billing overview: every company with plan, period end, used, cap and percentage
    /// (`limit` nil: all of them after `cursor`).
    public func companies(sortByUsage: Bool, after cursor: Int, limit: Int?, at: Date = Date()) async throws -> [CompanyOverview] {
        let order = sortByUsage ? "pct DESC NULLS LAST, used DESC, c.id" : "c.created_at, c.id"
        let offset = Int64(cursor)
        let limit = limit.map(Int64.init)  // LIMIT NULL is no limit
        var query = PostgresQuery(
            unsafeSQL: """
                SELECT c.id, c.name, pp.plan_id, pp.ends_at, COALESCE(cu.used, 0) AS used, pl.monthly_company_cap,
                       CASE WHEN pl.monthly_company_cap > 0 THEN (COALESCE(cu.used, 0) * 100.0 / pl.monthly_company_cap)::float8 END AS pct
                  FROM companies c
                  LEFT JOIN plan_periods pp ON pp.company_id = c.id AND pp.started_at <= $1 AND pp.ends_at > $1
                  LEFT JOIN plans pl ON pl.id = pp.plan_id
                  LEFT JOIN company_usage cu ON cu.company_id = c.id AND cu.period_id = pp.id
                 ORDER BY \(order)
                 OFFSET $2 LIMIT $3
                """
        )
        query.binds.append(at)
        query.binds.append(offset)
        query.binds.append(limit)
        let q = query
        return try await database.run { client in
            var out: [CompanyOverview] = []
            for try await (id, name, plan, end, used, cap, pct) in try await client.query(q, logger: logger)
                .decode((UUID, String, String?, Date?, Int64, Int64?, Double?).self)
            {
                out.append(
                    CompanyOverview(
                        id: id, name: name, plan: plan, periodEnd: end, used: used, cap: cap,
                        percentUsed: pct.map { ($0 * 10).rounded() / 10 }))
            }
            return out
        }
    }
}

extension UsageStore.Event {
    /// A row of ``UsageStore/events(company:from:to:after:limit:feature:newestFirst:now:grace:)``,
    /// read by name; its settlement as it stands at `now`.
    init(row r: PostgresRandomAccessRow, company: UUID, now: Date, grace: TimeInterval) throws {
        let createdAt: Date = try r.column("created_at")
        let outcome: String = try r.column("outcome")
        let upstreamStatus: Int32? = try r.column("upstream_status")
        let settledAt: Date? = try r.column("settled_at")
        self.init(
            id: try r.column("id"), createdAt: createdAt, companyID: company, userID: try r.column("user_id"),
            periodStart: try r.column("started_at"), periodEnd: try r.column("ends_at"), units: try r.column("units"),
            inputTokens: try r.column("input_tokens"), outputTokens: try r.column("output_tokens"), method: try r.column("method"),
            route: try r.column("route"), model: try r.column("model"), feature: try r.column("feature"), outcome: outcome,
            upstreamStatus: upstreamStatus, requestID: try r.column("request_id"), idempotencyKey: try r.column("idempotency_key"),
            settlement: .of(
                outcome: outcome, settledAt: settledAt, upstreamStatus: upstreamStatus, createdAt: createdAt, now: now, grace: grace),
            cacheWriteTokens: try r.column("cache_write_tokens"), cacheReadTokens: try r.column("cache_read_tokens"),
            hold: try r.column("hold_micros", as: Int64?.self).map(Micros.init),
            cost: try r.column("cost_micros", as: Int64?.self).map(Micros.init), costSource: try r.column("cost_source"))
    }
}
