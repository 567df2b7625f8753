import Foundation
import PostgresNIO

/// The current-period reads (`GET /admin/v1/companies/{id}/usage`, `GET /v1/usage`), each from
/// one snapshot: a read-only REPEATABLE READ transaction on one connection
/// (``Database/snapshot(_:)``) with two statements, the company's row with its users and the
/// features. A company's `used` is then the sum of what its users' rows show, even while calls
/// are admitted, which reads spread over pooled connections could not promise.
extension UsageStore {
    /// The admin usage read; nil when there is no such company.
    public func companyUsage(_ company: UUID, at: Date = Date()) async throws -> CompanyUsage? {
        let read = try await current(company: company, user: nil, at: at)
        guard let row = read.company else { return nil }
        return CompanyUsage(
            company: TenantStore.companyJSON(row), state: read.state, features: read.features, users: read.users,
            cost: CostUsage(company: read.cost.company), grants: read.grants, at: at)
    }

    /// What `user` of `company` sees in `GET /v1/usage`.
    public func callerUsage(company: UUID, user: UUID, at: Date = Date()) async throws -> CallerUsage {
        let read = try await current(company: company, user: user, at: at)
        var state = read.state
        state.rate = try await rateWindows(company: company, user: user, at: at)
        // Each enabled feature's own windows (an entitlement's limits, SPEC §14), as its calls count them.
        var featureRates: [(minute: Date, windows: RateState.FeatureWindows)] = []
        for feature in read.features where feature.enabled {
            if let windows = try await featureRateWindows(company: company, user: user, feature: feature.id, at: at) {
                featureRates.append(windows)
            }
        }
        let token = try await database.run { client in
            try await client.query("SELECT app_account_token FROM companies WHERE id = \(company)", logger: logger)
                .decode(UUID.self).collect().first
        }
        return CallerUsage(
            company: company, user: user, appAccountToken: token, state: state, features: read.features, cost: read.cost,
            grants: read.grants, at: at, featureRates: featureRates)
    }

    /// One read of the period containing `at`. When none does, the company is first moved into
    /// it (`capgate_roll_company`, as the next call's admission and ``MeteringStore/state(companyID:userID:at:)``
    /// do), then read again if that changed anything.
    func current(company: UUID, user: UUID?, at: Date) async throws -> CurrentRead {
        let read = try await snapshotRead(company: company, user: user, at: at)
        guard read.company != nil, read.state.periodStart == nil else { return read }
        let change = try await database.write { connection in
            try await connection.query("SELECT capgate_roll_company(\(company), \(at))", logger: logger).decode(String.self).collect().first
        }
        // 'none': nothing was due (no period ever, or one starting later); the read stands.
        guard change != "none" else { return read }
        return try await snapshotRead(company: company, user: user, at: at)
    }

    struct CurrentRead: Sendable {
        /// Nil: no such company.
        var company: TenantStore.CompanyRow?
        var state: UsageState
        var features: [FeatureUsage]
        /// Every user of the company when the read is the admin's (`user` nil); else empty.
        var users: [UserUsage]
        /// The company's cost budget, and `user`'s when the read is a user's.
        var cost: CostUsage
        /// The company's top-up grants (SPEC §12), earliest expiry first.
        var grants: [TopUpGrant] = []
    }

    /// The row: the company (all nil when there is none), the plan and period containing `at`
    /// (nil when none), the company's and `user`'s units and caps, the upgrade offer, and, for
    /// the admin read, one user of the company per row (the rest repeated; nil when it has none);
    /// then the cost budgets (SPEC §11) in micro-dollars: the company's used, held and budget,
    /// `user`'s used, held and own budget, the plan's per-user budget, and the listed user's
    /// used, held and own budget.
    typealias HeaderRow = (
        UUID?, String?, Date?, String?, Date?, Date?, Bool?, String?, String?,
        String?, Int64, Int64?, Int64?, Int64, Int64?,
        String?, Int64?, Int64?,
        UUID?, String?, String?, Int64, Int64?, Bool?,
        Int64, Int64, Int64?, Int64, Int64, Int64?, Int64?,
        Int64, Int64, Int64?
    )

    func snapshotRead(company: UUID, user: UUID?, at: Date) async throws -> CurrentRead {
        let listUsers = user == nil
        return try await database.snapshot { connection in
            // The upgrade is what a cap's refusal would offer (capgate_upgrade_offer).
            let rows = try await connection.query(
                """
                SELECT c.id, c.name, c.created_at, pp.plan_id, pp.started_at, pp.ends_at, pp.auto_renew, c.time_zone, c.webhook_url,
                       pl.name, COALESCE(cu.used, 0), pl.monthly_company_cap, pl.monthly_user_cap, COALESCE(uu.used, 0), me.monthly_cap,
                       up.id, up.monthly_company_cap, up.monthly_user_cap,
                       u.id, u.email, u.role, COALESCE(ou.used, 0), u.monthly_cap, u.disabled,
                       COALESCE(cu.cost_used, 0), COALESCE(cu.cost_held, 0), pl.monthly_company_budget,
                       COALESCE(uu.cost_used, 0), COALESCE(uu.cost_held, 0), me.monthly_budget, pl.monthly_user_budget,
                       COALESCE(ou.cost_used, 0), COALESCE(ou.cost_held, 0), u.monthly_budget
                  FROM (VALUES (1)) AS one (n)
                  LEFT JOIN companies c ON c.id = \(company)
                  LEFT JOIN plan_periods pp ON pp.company_id = c.id AND pp.started_at <= \(at) AND pp.ends_at > \(at)
                  LEFT JOIN plans pl ON pl.id = pp.plan_id
                  LEFT JOIN company_usage cu ON cu.company_id = c.id AND cu.period_id = pp.id
                  LEFT JOIN user_usage uu ON uu.company_id = c.id AND uu.period_id = pp.id AND uu.user_id = \(user)::uuid
                  LEFT JOIN users me ON me.company_id = c.id AND me.id = \(user)::uuid
                  LEFT JOIN LATERAL capgate_upgrade_offer(
                      CASE WHEN pl.id IS NULL THEN 'no_active_plan' ELSE 'company_cap' END, pl.id, NULL, NULL, NULL
                  ) AS up (id, monthly_company_cap, monthly_user_cap, feature_limit) ON true
                  LEFT JOIN users u ON \(listUsers) AND u.company_id = c.id
                  LEFT JOIN user_usage ou ON ou.company_id = c.id AND ou.period_id = pp.id AND ou.user_id = u.id
                 ORDER BY u.created_at, u.id
                """,
                logger: logger
            )
            var header: HeaderRow? = nil
            var users: [(id: UUID, email: String?, role: String, used: Int64, override: Int64?, disabled: Bool, cost: CostCounter)] = []
            for try await r in rows.decode(HeaderRow.self) {
                if header == nil { header = r }
                if let id = r.18, let role = r.20 {
                    // As the cap beside it: the user's own budget, else the plan's per-user one.
                    users.append((id, r.19, role, r.21, r.22, r.23 ?? false, CostCounter(used: r.31, held: r.32, limit: r.33 ?? r.30)))
                }
            }
            guard let h = header else { throw DatabaseError.other("usage read: no row") }
            var read = Self.read(h, user: user)
            if read.company != nil, read.state.periodStart != nil {
                read.features = try await features(on: connection, company: company, user: user, at: at)
            }
            if read.company != nil {
                read.grants = try await TopUpGrant.all(of: company, on: connection, logger: logger)
            }
            let planUserCap = h.12
            read.users = users.map {
                UserUsage(
                    id: $0.id, email: $0.email, role: $0.role, disabled: $0.disabled, used: $0.used, limit: $0.override ?? planUserCap,
                    features: read.features, cost: $0.cost)
            }
            return read
        }
    }

    /// The company, state and upgrade of a ``HeaderRow`` (no features, no users yet).
    static func read(_ h: HeaderRow, user: UUID?) -> CurrentRead {
        let company: TenantStore.CompanyRow? =
            if let id = h.0, let name = h.1, let created = h.2, let zone = h.7 {
                (id, name, created, h.3, h.4, h.5, h.6, zone, h.8)
            } else {
                nil
            }
        var state: UsageState
        if let plan = h.3, let name = h.9, let start = h.4, let end = h.5 {
            state = UsageState(
                plan: .init(id: plan, name: name), periodStart: start, periodEnd: end, companyUsed: h.10, companyLimit: h.11,
                userUsed: user == nil ? nil : h.13, userLimit: h.14 ?? h.12)
        } else {
            state = UsageState(
                plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: user == nil ? nil : 0,
                userLimit: nil)
        }
        state.upgrade = h.15.map { UsageState.Upgrade(plan: $0, companyLimit: h.16, userLimit: h.17) }
        // Budgets as the caps in `state`: the plan's (the user's own overriding its per-user
        // one); without a plan nothing is counted (the counters are the current period's) and
        // nothing bounds.
        let plan = h.3 != nil
        let companyCost = CostState.Counter(used: h.24, held: h.25, limit: h.26)
        let userCost = user == nil ? nil : CostState.Counter(used: h.27, held: h.28, limit: plan ? h.29 ?? h.30 : nil)
        // The same counters give `GET /v1/usage` its "company-cost"/"user-cost" RateLimit fields.
        state.cost = CostState(company: companyCost, user: userCost, hold: nil)
        let cost = CostUsage(company: CostCounter(companyCost), user: userCost.map(CostCounter.init))
        return CurrentRead(company: company, state: state, features: [], users: [], cost: cost)
    }
}
