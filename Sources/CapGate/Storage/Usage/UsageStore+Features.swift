import Foundation
import PostgresNIO

/// The features of a company's plan with their counters (SPEC §8), for `GET /v1/usage`, the
/// admin usage read and `GET /v1/usage/check?feature=`.
extension UsageStore {
    /// What `GET /v1/usage/check?feature=` found for one feature id.
    public enum FeatureLookup: Sendable {
        /// No such feature, or it is not active: a call naming it would be 400.
        case unknown
        /// Active, but the company's current plan has no enabled entitlement for it (or no plan).
        case notInPlan(id: String, name: String)
        /// In the plan and enabled, with its windows.
        case entitled(FeatureUsage)
    }

    /// Every active feature of the company's plan in the period containing `at` (by the
    /// features' `sort_order`, then id; an entitlement with `enabled: false` included), with the
    /// company's day and period counters and the counters of `user`, or of every user of the
    /// company when `user` is nil. Empty when no period contains `at`. One query.
    public func features(company: UUID, user: UUID?, at: Date = Date()) async throws -> [FeatureUsage] {
        try await database.run { client in
            try await client.withConnection { try await features(on: $0, company: company, user: user, at: at) }
        }
    }

    /// As ``features(company:user:at:)``, on `connection` (inside a ``Database/snapshot(_:)``).
    func features(on connection: PostgresConnection, company: UUID, user: UUID?, at: Date) async throws -> [FeatureUsage] {
        try await featureRows(on: connection, company: company, user: user, only: nil, at: at).compactMap { row in
            row.inPlan ? row.usage : nil
        }
    }

    /// One feature as `usage/check` needs it, with the counters of `user`, and the start of the
    /// period it was read in (nil: none contains `at`). One query.
    public func feature(
        _ id: String, company: UUID, user: UUID, at: Date = Date()
    ) async throws -> (lookup: FeatureLookup, periodStart: Date?) {
        let rows = try await database.run { client in
            try await client.withConnection { try await featureRows(on: $0, company: company, user: user, only: id, at: at) }
        }
        guard let row = rows.first, row.isActive else {
            return (.unknown, nil)
        }
        guard row.inPlan, let usage = row.usage, usage.enabled else { return (.notInPlan(id: id, name: row.name), row.periodStart) }
        return (.entitled(usage), row.periodStart)
    }

    /// The rows behind both reads: the plan's active features (`only` nil), or the feature `only`
    /// whether or not it is in the plan. Counters are found by their keys (SPEC §8: a day starts
    /// at midnight in the company's zone, computed by `capgate_day_start`; a period window starts
    /// at the period's start), each a primary-key lookup; a missing row is 0. Users' counters
    /// come as three parallel arrays per feature, so every user costs no extra query.
    func featureRows(
        on connection: PostgresConnection, company: UUID, user: UUID?, only: String?, at: Date
    ) async throws -> [(name: String, isActive: Bool, inPlan: Bool, periodStart: Date?, usage: FeatureUsage?)] {
        let rows = try await connection.query(
            """
            WITH p AS (
                SELECT pp.plan_id, pp.started_at, pp.ends_at,
                       capgate_day_start(\(at), c.time_zone) AS day_start, capgate_day_end(\(at), c.time_zone) AS day_end
                  FROM plan_periods pp JOIN companies c ON c.id = pp.company_id
                 WHERE pp.company_id = \(company) AND pp.started_at <= \(at) AND pp.ends_at > \(at)
            )
            SELECT f.id, f.name, f.is_active, e.feature_id IS NOT NULL AS in_plan, coalesce(e.enabled, false) AS enabled,
                   e.daily_limit, e.period_limit, e.user_daily_limit, e.user_period_limit, p.day_start, p.day_end, p.ends_at,
                   coalesce(cd.used, 0) AS company_day, coalesce(cp.used, 0) AS company_period,
                   coalesce(u.ids, '{}'::uuid[]) AS user_ids, coalesce(u.day, '{}'::bigint[]) AS user_day,
                   coalesce(u.period, '{}'::bigint[]) AS user_period, p.started_at
              FROM features f
              LEFT JOIN p ON true
              LEFT JOIN plan_features e ON e.plan_id = p.plan_id AND e.feature_id = f.id
              LEFT JOIN company_feature_usage cd
                     ON cd.company_id = \(company) AND cd.feature_id = f.id AND cd.span = 'day' AND cd.starts_at = p.day_start
              LEFT JOIN company_feature_usage cp
                     ON cp.company_id = \(company) AND cp.feature_id = f.id AND cp.span = 'period' AND cp.starts_at = p.started_at
              LEFT JOIN LATERAL (
                  SELECT array_agg(s.id ORDER BY s.id) AS ids, array_agg(s.day ORDER BY s.id) AS day,
                         array_agg(s.period ORDER BY s.id) AS period
                    FROM (SELECT usr.id, coalesce(ud.used, 0) AS day, coalesce(up.used, 0) AS period
                            FROM users usr
                            LEFT JOIN user_feature_usage ud
                                   ON ud.company_id = usr.company_id AND ud.user_id = usr.id AND ud.feature_id = f.id
                                  AND ud.span = 'day' AND ud.starts_at = p.day_start
                            LEFT JOIN user_feature_usage up
                                   ON up.company_id = usr.company_id AND up.user_id = usr.id AND up.feature_id = f.id
                                  AND up.span = 'period' AND up.starts_at = p.started_at
                           WHERE usr.company_id = \(company) AND (\(user)::uuid IS NULL OR usr.id = \(user)::uuid)
                             AND (ud.used IS NOT NULL OR up.used IS NOT NULL)) s
              ) u ON e.feature_id IS NOT NULL
             WHERE CASE WHEN \(only)::text IS NULL THEN e.feature_id IS NOT NULL AND f.is_active ELSE f.id = \(only)::text END
             ORDER BY f.sort_order, f.id
            """,
            logger: logger
        )
        var out: [(name: String, isActive: Bool, inPlan: Bool, periodStart: Date?, usage: FeatureUsage?)] = []
        for try await row in rows {
            let r = row.makeRandomAccess()
            let inPlan: Bool = try r.column("in_plan")
            let usage: FeatureUsage? = try inPlan ? FeatureUsage(row: r) : nil
            let name: String = try r.column("name")
            let isActive: Bool = try r.column("is_active")
            let periodStart: Date? = try r.column("started_at")
            out.append((name: name, isActive: isActive, inPlan: inPlan, periodStart: periodStart, usage: usage))
        }
        return out
    }
}

extension FeatureUsage {
    /// A feature of ``UsageStore/featureRows(on:company:user:only:at:)`` that is in the plan, read
    /// by name; nil without a period (no day or period window to count in).
    init?(row r: PostgresRandomAccessRow) throws {
        guard let dayStart: Date = try r.column("day_start"), let dayEnd: Date = try r.column("day_end"),
            let periodEnd: Date = try r.column("ends_at")
        else { return nil }
        let ids: [UUID] = try r.column("user_ids")
        let days: [Int64] = try r.column("user_day")
        let periods: [Int64] = try r.column("user_period")
        var users: [UUID: FeatureUsage.Used] = [:]
        for (i, id) in ids.enumerated() where i < days.count && i < periods.count {
            users[id] = FeatureUsage.Used(day: days[i], period: periods[i])
        }
        self.init(
            id: try r.column("id"), name: try r.column("name"), enabled: try r.column("enabled"), dailyLimit: try r.column("daily_limit"),
            periodLimit: try r.column("period_limit"), userDailyLimit: try r.column("user_daily_limit"),
            userPeriodLimit: try r.column("user_period_limit"), dayStart: dayStart, dayEnd: dayEnd, periodEnd: periodEnd,
            company: .init(day: try r.column("company_day"), period: try r.column("company_period")), users: users)
    }
}
