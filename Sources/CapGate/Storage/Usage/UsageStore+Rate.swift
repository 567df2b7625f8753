import Foundation
import PostgresNIO

/// The rate windows of `GET /v1/usage` (SPEC §14): the caller's plan's per-minute limits, what
/// the company's and the caller's windows hold in the current UTC minute, and the caller's calls
/// in flight. Read apart from the period snapshot: the windows move every minute anyway.
extension UsageStore {
    /// nil when the company's plan (of the period containing `at`) sets no rate limit.
    func rateWindows(company: UUID, user: UUID, at: Date) async throws -> RateState? {
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT pl.company_rpm::bigint, pl.company_tpm, pl.user_rpm::bigint, pl.user_tpm, pl.user_concurrency::bigint,
                       m.minute,
                       coalesce(CASE WHEN cu.rate_minute >= m.minute THEN cu.rate_calls END, cc.calls),
                       coalesce(CASE WHEN cu.rate_minute >= m.minute THEN cu.rate_tokens END, cc.tokens),
                       coalesce(CASE WHEN uu.rate_minute >= m.minute THEN uu.rate_calls END, uc.calls),
                       coalesce(CASE WHEN uu.rate_minute >= m.minute THEN uu.rate_tokens END, uc.tokens),
                       (SELECT count(*) FROM rate_calls s
                         WHERE s.company_id = pp.company_id AND s.user_id = \(user) AND (s.scopes & 4) <> 0
                           AND s.lease_until > \(at)::timestamptz)
                  FROM plan_periods pp JOIN plans pl ON pl.id = pp.plan_id
                 CROSS JOIN (SELECT date_trunc('minute', \(at)::timestamptz, 'UTC') AS minute) m
                  LEFT JOIN company_usage cu ON cu.company_id = pp.company_id AND cu.period_id = pp.id
                  LEFT JOIN user_usage uu ON uu.company_id = pp.company_id AND uu.period_id = pp.id AND uu.user_id = \(user)
                 CROSS JOIN LATERAL capgate_rate_carry(pp.company_id, NULL, pp.started_at, m.minute) cc
                 CROSS JOIN LATERAL capgate_rate_carry(pp.company_id, \(user), pp.started_at, m.minute) uc
                 WHERE pp.company_id = \(company) AND pp.started_at <= \(at)::timestamptz AND pp.ends_at > \(at)::timestamptz
                """,
                logger: logger
            ).decode((Int64?, Int64?, Int64?, Int64?, Int64?, Date, Int64?, Int64?, Int64?, Int64?, Int64).self).collect()
        }
        guard let r = rows.first else { return nil }
        let limits = RateState.Limits(companyRPM: r.0, companyTPM: r.1, userRPM: r.2, userTPM: r.3, userConcurrency: r.4)
        guard !limits.isEmpty else { return nil }
        return RateState(
            limits: limits, minute: r.5,
            counts: .init(companyCalls: r.6 ?? 0, companyTokens: r.7 ?? 0, userCalls: r.8 ?? 0, userTokens: r.9 ?? 0, userInFlight: r.10))
    }
}

extension UsageStore {
    /// The windows an entitlement sets for `feature` in the company's plan (of the period
    /// containing `at`), as the admission counts them: the company's and the user's rows of the
    /// feature in the current UTC minute, and the user's calls of the feature in flight. nil
    /// when the entitlement sets none (or the plan has none for the feature).
    func featureRateWindows(
        company: UUID, user: UUID, feature: String, at: Date
    ) async throws -> (
        minute: Date, windows: RateState.FeatureWindows
    )? {
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT pf.company_rpm::bigint, pf.company_tpm, pf.user_rpm::bigint, pf.user_tpm, pf.user_concurrency::bigint,
                       m.minute, w.company_calls, w.company_tokens, w.user_calls, w.user_tokens,
                       (SELECT count(*) FROM rate_calls s
                         WHERE s.company_id = pp.company_id AND s.user_id = \(user) AND (s.scopes & 4) <> 0
                           AND s.lease_until > \(at)::timestamptz AND s.feature_id = pf.feature_id)
                  FROM plan_periods pp JOIN plan_features pf ON pf.plan_id = pp.plan_id AND pf.feature_id = \(feature)
                 CROSS JOIN (SELECT date_trunc('minute', \(at)::timestamptz, 'UTC') AS minute) m
                 -- The company's row (the nil user) and the user's, each counted only in its minute.
                 CROSS JOIN LATERAL (
                       SELECT coalesce(sum(r.calls) FILTER (WHERE r.user_id = \(UUID.zero)), 0)::bigint AS company_calls,
                              coalesce(sum(r.tokens) FILTER (WHERE r.user_id = \(UUID.zero)), 0)::bigint AS company_tokens,
                              coalesce(sum(r.calls) FILTER (WHERE r.user_id = \(user)), 0)::bigint AS user_calls,
                              coalesce(sum(r.tokens) FILTER (WHERE r.user_id = \(user)), 0)::bigint AS user_tokens
                         FROM rate_windows r
                        WHERE r.company_id = pp.company_id AND r.feature_id = pf.feature_id
                          AND r.user_id IN (\(UUID.zero), \(user)) AND r.minute >= m.minute) w
                 WHERE pp.company_id = \(company) AND pp.started_at <= \(at)::timestamptz AND pp.ends_at > \(at)::timestamptz
                """,
                logger: logger
            ).decode((Int64?, Int64?, Int64?, Int64?, Int64?, Date, Int64, Int64, Int64, Int64, Int64).self).collect()
        }
        guard let r = rows.first else { return nil }
        let limits = RateState.Limits(companyRPM: r.0, companyTPM: r.1, userRPM: r.2, userTPM: r.3, userConcurrency: r.4)
        guard !limits.isEmpty else { return nil }
        let counts = RateState.Counts(companyCalls: r.6, companyTokens: r.7, userCalls: r.8, userTokens: r.9, userInFlight: r.10)
        return (r.5, RateState.FeatureWindows(id: feature, limits: limits, counts: counts))
    }
}

extension RateState {
    /// `GET /v1/usage`'s `rate`: one object per window the plan sets, in SPEC §14's order, as a
    /// 429's `usage.rate` names them, with what remains.
    func usageJSON(now: Date) -> JSON {
        .array(
            limits.windows.map { window in
                let limit = limits[window]
                let used = counts[window] ?? 0
                return .obj([
                    "window": .string(window.rawValue), "limit": JSON(limit), "used": .int(used),
                    "remaining": JSON(limit.map { max(0, $0 - used) }),
                    "reset_at": window == .userConcurrency ? .null : JSON(resetAt(window, now: now)),
                ])
            })
    }
}
