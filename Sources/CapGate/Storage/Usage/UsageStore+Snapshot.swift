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

    func snapshotRead(company: UUID, user: UUID?, at: Date) async throws -> CurrentRead {
        let listUsers = user == nil
        return try await database.snapshot { connection in
            let query = Self.headerQuery(company: company, user: user, listUsers: listUsers, at: at)
            let rows = try await connection.query(query, logger: logger)
            var header: Header? = nil
            var users: [ListedUser] = []
            for try await row in rows {
                let r = row.makeRandomAccess()
                if header == nil { header = try Header(row: r) }
                if let listed = try ListedUser(row: r) { users.append(listed) }
            }
            guard let h = header else { throw DatabaseError.other("usage read: no row") }
            var read = Self.read(h, user: user)
            if read.company != nil, read.state.periodStart != nil {
                read.features = try await features(on: connection, company: company, user: user, at: at)
            }
            if read.company != nil {
                read.grants = try await TopUpGrant.all(of: company, on: connection, logger: logger)
            }
            let planUserCap = h.period.planUserCap
            read.users = users.map {
                UserUsage(
                    id: $0.id, email: $0.email, role: $0.role, disabled: $0.disabled, used: $0.used, limit: $0.override ?? planUserCap,
                    features: read.features, cost: $0.cost)
            }
            return read
        }
    }

    /// The company (all NULL when there is none), the plan and period containing `at` (NULL when
    /// none), the company's and `user`'s units and caps, the upgrade offer a cap's refusal would
    /// make (`capgate_upgrade_offer`), and, for the admin read (`listUsers`), one user of the
    /// company per row (the rest repeated; NULL when it has none); then the cost budgets (SPEC
    /// §11) in micro-dollars: the company's used, held and budget, `user`'s used, held and own
    /// budget, the plan's per-user budget, and the listed user's used, held and own budget.
    ///
    /// Each listed user's counters are one probe of `user_usage`'s key (the `LATERAL … OFFSET 0`
    /// keeps the planner from folding it into a join): as a plain join, a company of 640 users with
    /// twelve past periods was read by a merge join on (company, period) filtering the user, every
    /// user against every row of the period, 170 ms (BENCHMARKS.md session 41); probed, 10 ms.
    static func headerQuery(company: UUID, user: UUID?, listUsers: Bool, at: Date) -> PostgresQuery {
        """
        SELECT c.id, c.name, c.created_at, pp.plan_id, pp.started_at, pp.ends_at, pp.auto_renew, c.time_zone, c.webhook_url,
               pl.name AS plan_name, COALESCE(cu.used, 0) AS company_used, pl.monthly_company_cap, pl.monthly_user_cap,
               COALESCE(uu.used, 0) AS user_used, me.monthly_cap AS user_cap,
               up.id AS upgrade_plan, up.monthly_company_cap AS upgrade_company_cap, up.monthly_user_cap AS upgrade_user_cap,
               u.id AS listed_id, u.email AS listed_email, u.role AS listed_role, COALESCE(ou.used, 0) AS listed_used,
               u.monthly_cap AS listed_cap, u.disabled AS listed_disabled,
               COALESCE(cu.cost_used, 0) AS company_cost_used, COALESCE(cu.cost_held, 0) AS company_cost_held, pl.monthly_company_budget,
               COALESCE(uu.cost_used, 0) AS user_cost_used, COALESCE(uu.cost_held, 0) AS user_cost_held, me.monthly_budget AS user_budget,
               pl.monthly_user_budget, COALESCE(ou.cost_used, 0) AS listed_cost_used, COALESCE(ou.cost_held, 0) AS listed_cost_held,
               u.monthly_budget AS listed_budget
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
          LEFT JOIN LATERAL (
              SELECT x.used, x.cost_used, x.cost_held FROM user_usage x
               WHERE x.company_id = c.id AND x.period_id = pp.id AND x.user_id = u.id
              OFFSET 0
          ) ou ON true
         ORDER BY u.created_at, u.id
        """
    }

    /// The company, state and upgrade of a ``Header`` (no features, no users yet).
    static func read(_ h: Header, user: UUID?) -> CurrentRead {
        let p = h.period
        var state: UsageState
        if let plan = p.plan, let name = p.planName, let start = p.start, let end = p.end {
            state = UsageState(
                plan: .init(id: plan, name: name), periodStart: start, periodEnd: end, companyUsed: p.companyUsed,
                companyLimit: p.companyCap, userUsed: user == nil ? nil : p.userUsed, userLimit: p.userCap ?? p.planUserCap)
        } else {
            state = UsageState(
                plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: user == nil ? nil : 0,
                userLimit: nil)
        }
        state.upgrade = h.upgrade
        // Budgets as the caps in `state`: the plan's (the user's own overriding its per-user
        // one); without a plan nothing is counted (the counters are the current period's) and
        // nothing bounds.
        let c = h.cost
        let companyCost = CostState.Counter(used: c.companyUsed, held: c.companyHeld, limit: c.companyBudget)
        let userBudget = p.plan != nil ? c.userBudget ?? c.planUserBudget : nil
        let userCost = user == nil ? nil : CostState.Counter(used: c.userUsed, held: c.userHeld, limit: userBudget)
        // The same counters give `GET /v1/usage` its "company-cost"/"user-cost" RateLimit fields.
        state.cost = CostState(company: companyCost, user: userCost, hold: nil)
        let cost = CostUsage(company: CostCounter(companyCost), user: userCost.map(CostCounter.init))
        return CurrentRead(company: h.company, state: state, features: [], users: [], cost: cost)
    }
}

extension UsageStore {
    /// The columns of ``headerQuery(company:user:listUsers:at:)`` every row repeats, read by name.
    struct Header: Sendable {
        /// The period containing the read's time and its unit counters (NULL: no period).
        struct Period: Sendable {
            var plan: String?
            var planName: String?
            var start: Date?
            var end: Date?
            var companyUsed: Int64
            var companyCap: Int64?
            var planUserCap: Int64?
            var userUsed: Int64
            /// The user's own cap (`users.monthly_cap`), overriding the plan's.
            var userCap: Int64?
        }

        /// The cost counters and budgets, in micro-dollars.
        struct Cost: Sendable {
            var companyUsed: Int64
            var companyHeld: Int64
            var companyBudget: Int64?
            var userUsed: Int64
            var userHeld: Int64
            /// The user's own budget, overriding ``planUserBudget``.
            var userBudget: Int64?
            var planUserBudget: Int64?
        }

        /// Nil: no such company.
        var company: TenantStore.CompanyRow?
        var period: Period
        var upgrade: UsageState.Upgrade?
        var cost: Cost

        init(row r: PostgresRandomAccessRow) throws {
            company = try Self.company(r)
            period = Period(
                plan: try r.column("plan_id"), planName: try r.column("plan_name"), start: try r.column("started_at"),
                end: try r.column("ends_at"), companyUsed: try r.column("company_used"), companyCap: try r.column("monthly_company_cap"),
                planUserCap: try r.column("monthly_user_cap"), userUsed: try r.column("user_used"), userCap: try r.column("user_cap"))
            upgrade = try r.column("upgrade_plan", as: String?.self).map {
                UsageState.Upgrade(plan: $0, companyLimit: try r.column("upgrade_company_cap"), userLimit: try r.column("upgrade_user_cap"))
            }
            cost = Cost(
                companyUsed: try r.column("company_cost_used"), companyHeld: try r.column("company_cost_held"),
                companyBudget: try r.column("monthly_company_budget"), userUsed: try r.column("user_cost_used"),
                userHeld: try r.column("user_cost_held"), userBudget: try r.column("user_budget"),
                planUserBudget: try r.column("monthly_user_budget"))
        }

        /// The company's columns (``TenantStore/CompanyRow``); nil when there is no such company.
        static func company(_ r: PostgresRandomAccessRow) throws -> TenantStore.CompanyRow? {
            guard let id: UUID = try r.column("id"), let name: String = try r.column("name"),
                let created: Date = try r.column("created_at"), let zone: String = try r.column("time_zone")
            else { return nil }
            let plan: String? = try r.column("plan_id")
            let start: Date? = try r.column("started_at")
            let end: Date? = try r.column("ends_at")
            let autoRenew: Bool? = try r.column("auto_renew")
            let webhook: String? = try r.column("webhook_url")
            return (id, name, created, plan, start, end, autoRenew, zone, webhook)
        }
    }

    /// One user of the company in the admin read, with its cost budget as the cap beside it:
    /// its own, else the plan's per-user one.
    struct ListedUser: Sendable {
        var id: UUID
        var email: String?
        var role: String
        var used: Int64
        var override: Int64?
        var disabled: Bool
        var cost: CostCounter

        /// Nil on the row of a company without users (or a user's read, which lists none).
        init?(row r: PostgresRandomAccessRow) throws {
            guard let id: UUID = try r.column("listed_id"), let role: String = try r.column("listed_role") else { return nil }
            self.id = id
            self.role = role
            email = try r.column("listed_email")
            used = try r.column("listed_used")
            override = try r.column("listed_cap")
            disabled = try r.column("listed_disabled", as: Bool?.self) ?? false
            let budget: Int64? = try r.column("listed_budget")
            let planBudget: Int64? = try r.column("monthly_user_budget")
            cost = CostCounter(used: try r.column("listed_cost_used"), held: try r.column("listed_cost_held"), limit: budget ?? planBudget)
        }
    }
}
