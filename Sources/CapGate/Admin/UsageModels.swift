import Foundation

/// `GET /admin/v1/companies/{id}/usage` (SPEC §4): the company, its usage in the current
/// period, its features and every user, all read from one snapshot
/// (``UsageStore/companyUsage(_:at:)``), so the company's `used` and the users' agree.
public struct CompanyUsage: Sendable {
    /// The company object of SPEC §5 (as `GET /admin/v1/companies/{id}` shows it).
    public var company: JSON
    /// The company's counters, plan, period and upgrade (`usage`, scope `company`).
    public var state: UsageState
    /// The plan's features with the company's windows (each user's are in ``users``).
    public var features: [FeatureUsage]
    /// Every user of the company, in creation order.
    public var users: [UserUsage]
    /// The company's cost budget (SPEC §11); each user's is in ``users``.
    public var cost: CostUsage = .unlimited
    /// The company's top-up grants (SPEC §12), earliest expiry first.
    public var grants: [TopUpGrant] = []
    /// When it was read (a grant's `remaining` is 0 once expired).
    public var at: Date = Date()

    package init(
        company: JSON, state: UsageState, features: [FeatureUsage], users: [UserUsage], cost: CostUsage = .unlimited,
        grants: [TopUpGrant] = [],
        at: Date = Date()
    ) {
        self.company = company
        self.state = state
        self.features = features
        self.users = users
        self.cost = cost
        self.grants = grants
        self.at = at
    }
}

extension CompanyUsage: Encodable {
    enum CodingKeys: String, CodingKey { case company, usage, features, users, cost, grants }

    /// `usage` and `features` are the hand-written objects the 402 body shares (``UsageState``,
    /// ``FeatureUsage``); the company's features and its `cost` (company only, no `user`)
    /// appear at the top and inside `usage`, which so has the shape of `GET /v1/usage`'s.
    public func encode(to encoder: any Encoder) throws {
        let companyFeatures = JSON.array(features.map { $0.json(user: nil) })
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(company, forKey: .company)
        let grants = JSON.array(self.grants.map { $0.json(at: at) })
        let usage = cost.adding(to: state.json(scope: .company, includeUser: false, features: companyFeatures))
        try c.encode(usage.adding("grants", grants), forKey: .usage)
        try c.encode(companyFeatures, forKey: .features)
        try c.encode(users, forKey: .users)
        try c.encode(cost, forKey: .cost)
        try c.encode(grants, forKey: .grants)
    }
}

/// One entry of the admin read's `users`: the user's units in the current period against its
/// cap (its own override, else the plan's per-user cap), and its own windows of each feature.
public struct UserUsage: Sendable, Equatable {
    public var id: UUID
    public var email: String?
    public var role: String
    public var disabled: Bool
    public var used: Int64
    /// `nil`: unlimited.
    public var limit: Int64?
    /// The plan's features (the user's own counters are found by ``id`` in each).
    public var features: [FeatureUsage]
    /// The user's cost budget: its own `monthly_budget`, else the plan's `monthly_user_budget`.
    public var cost: CostCounter = .unlimited

    /// `limit − used`, never below 0; `nil` when unlimited.
    public var remaining: Int64? { limit.map { max(0, $0 - used) } }

    public static func == (a: UserUsage, b: UserUsage) -> Bool {
        a.id == b.id && a.email == b.email && a.role == b.role && a.disabled == b.disabled && a.used == b.used
            && a.limit == b.limit && a.features.map { $0.used(by: a.id) } == b.features.map { $0.used(by: b.id) }
            && a.cost == b.cost
    }

    package init(
        id: UUID, email: String?, role: String, disabled: Bool, used: Int64, limit: Int64?, features: [FeatureUsage],
        cost: CostCounter = .unlimited
    ) {
        self.id = id
        self.email = email
        self.role = role
        self.disabled = disabled
        self.used = used
        self.limit = limit
        self.features = features
        self.cost = cost
    }
}

extension UserUsage: Encodable {
    enum CodingKeys: String, CodingKey { case id, email, role, disabled, used, limit, remaining, features, cost }

    /// Every key always present (`null` for no email or no limit); the id in lower case, as
    /// every id CapGate writes.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id.uuidString.lowercased(), forKey: .id)
        try c.encode(email, forKey: .email)
        try c.encode(role, forKey: .role)
        try c.encode(disabled, forKey: .disabled)
        try c.encode(used, forKey: .used)
        try c.encode(limit, forKey: .limit)
        try c.encode(remaining, forKey: .remaining)
        try c.encode(JSON.array(features.map { $0.userJSON(id) }), forKey: .features)
        try c.encode(cost, forKey: .cost)
    }
}

/// `GET /v1/usage` (SPEC §4): the caller's `usage` object (scope `user`) with the plan's
/// features, read from one snapshot (``UsageStore/callerUsage(company:user:at:)``).
public struct CallerUsage: Sendable {
    /// The caller's company.
    public var company: UUID
    public var user: UUID
    /// The company's purchase token: what an iOS app sets as a purchase's `appAccountToken`
    /// (SPEC §12; random, never the company id, rotated by the operator).
    public var appAccountToken: UUID?
    public var state: UsageState
    public var features: [FeatureUsage]
    /// The company's and the caller's cost budgets (SPEC §11).
    public var cost: CostUsage = .unlimited
    /// The company's top-up grants (SPEC §12), earliest expiry first.
    public var grants: [TopUpGrant] = []
    /// When it was read (a grant's `remaining` is 0 once expired; the rate windows' `reset_at`).
    public var at: Date = Date()
    /// The windows the plan's entitlements set for its features, each with the minute it counts.
    public var featureRates: [(minute: Date, windows: RateState.FeatureWindows)] = []
}

extension CallerUsage: Encodable {
    /// `company_id`, `user_id` and `app_account_token`, then the SPEC §3 `usage` object, as the 402 body writes it (``UsageState/json(scope:includeUser:featureRefusal:features:)``),
    /// with the read's `cost` (`company` and `user`).
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        let usage = cost.adding(to: state.json(scope: .user, features: .array(features.map { $0.json(user: user) })))
            .adding("grants", .array(grants.map { $0.json(at: at) }))
        guard case .object(var fields) = usage else { return try c.encode(usage) }
        // The rate windows (SPEC §14): an empty list when the plan sets none.
        // The plan's, then each feature's (its entries name the feature), as a 429 would.
        var rate = state.rate?.usageJSON(now: at).arrayValue ?? []
        for (minute, windows) in featureRates {
            let entries = RateState(limits: windows.limits, minute: minute, counts: windows.counts).usageJSON(now: at).arrayValue ?? []
            rate += entries.map { $0.adding("feature", .string(windows.id)) }
        }
        fields.append(.init("rate", .array(rate)))
        // The caller's ids at the top, and the purchase token the app sets as `appAccountToken` (SPEC §12).
        let top: [JSON.Field] = [
            .init("company_id", JSON(company)), .init("user_id", JSON(user)), .init("app_account_token", JSON(appAccountToken)),
        ]
        try c.encode(JSON.object(top + fields))
    }
}

/// One past period of `GET /admin/v1/companies/{id}/usage/history` (SPEC §4): its bounds and
/// plan, and what the company used of its cap (or, for `?feature=`, of that feature).
public struct PeriodUsage: Sendable, Equatable {
    public var start: Date
    public var end: Date
    public var planID: String
    public var planName: String
    public var used: Int64
    /// `nil`: unlimited.
    public var limit: Int64?
    /// The feature asked for, or nil for units.
    public var feature: String?
    /// The company's cost in the period against its plan's `monthly_company_budget` (as the
    /// plan is now, like `limit`), whatever `feature` says.
    public var cost: CostCounter = .unlimited

    package init(
        start: Date, end: Date, planID: String, planName: String, used: Int64, limit: Int64?, feature: String?,
        cost: CostCounter = .unlimited
    ) {
        self.start = start
        self.end = end
        self.planID = planID
        self.planName = planName
        self.used = used
        self.limit = limit
        self.feature = feature
        self.cost = cost
    }
}

extension PeriodUsage: Encodable {
    enum CodingKeys: String, CodingKey { case period, plan, company, used, limit, feature, cost }
    enum BoundsKeys: String, CodingKey { case start, end }
    enum PlanKeys: String, CodingKey { case id, name }
    enum CounterKeys: String, CodingKey { case used, limit, remaining }

    /// `used` and `limit` appear at the top and, with `remaining`, in `company`; nulls written.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        var period = c.nestedContainer(keyedBy: BoundsKeys.self, forKey: .period)
        try period.encode(Timestamp.format(start), forKey: .start)
        try period.encode(Timestamp.format(end), forKey: .end)
        var plan = c.nestedContainer(keyedBy: PlanKeys.self, forKey: .plan)
        try plan.encode(planID, forKey: .id)
        try plan.encode(planName, forKey: .name)
        var company = c.nestedContainer(keyedBy: CounterKeys.self, forKey: .company)
        try company.encode(used, forKey: .used)
        try company.encode(limit, forKey: .limit)
        try company.encode(limit.map { max(0, $0 - used) }, forKey: .remaining)
        try c.encode(used, forKey: .used)
        try c.encode(limit, forKey: .limit)
        try c.encode(feature, forKey: .feature)
        try c.encode(CostUsage(company: cost), forKey: .cost)
    }
}

/// One company of the operator's billing overview (`GET /admin/v1/companies`, SPEC §4).
public struct CompanyOverview: Sendable, Equatable {
    public var id: UUID
    public var name: String
    /// The plan of the period containing now; nil when none does.
    public var plan: String?
    public var periodEnd: Date?
    public var used: Int64
    /// The plan's company cap; nil when unlimited or no plan.
    public var cap: Int64?
    /// `used` as a percentage of `cap`, to one decimal; nil without a positive cap. A
    /// percentage, not money: a `Double` is what it is.
    public var percentUsed: Double?

    package init(id: UUID, name: String, plan: String?, periodEnd: Date?, used: Int64, cap: Int64?, percentUsed: Double?) {
        self.id = id
        self.name = name
        self.plan = plan
        self.periodEnd = periodEnd
        self.used = used
        self.cap = cap
        self.percentUsed = percentUsed
    }
}

extension CompanyOverview: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, name, plan, periodEnd = "period_end", used, cap, percentUsed = "percent_used"
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id.uuidString.lowercased(), forKey: .id)
        try c.encode(name, forKey: .name)
        try c.encode(plan, forKey: .plan)
        try c.encode(periodEnd.map(Timestamp.format), forKey: .periodEnd)
        try c.encode(used, forKey: .used)
        try c.encode(cap, forKey: .cap)
        try c.encode(percentUsed, forKey: .percentUsed)
    }
}

extension UsageStore.Event: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, time, companyID = "company_id", userID = "user_id", period, units, inputTokens = "input_tokens"
        case outputTokens = "output_tokens", method, route, model, feature, outcome, upstreamStatus = "upstream_status"
        case requestID = "request_id", idempotencyKey = "idempotency_key", settlement
        case cacheWriteTokens = "cache_write_tokens", cacheReadTokens = "cache_read_tokens", hold = "hold_usd", cost = "cost_usd"
        case costSource = "cost_source"
    }
    enum BoundsKeys: String, CodingKey { case start, end }

    /// A ledger row of `GET …/events`: every key present (`null` where the row has nothing);
    /// money as decimal strings of US dollars.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(Timestamp.format(createdAt), forKey: .time)
        try c.encode(companyID.uuidString.lowercased(), forKey: .companyID)
        try c.encode(userID.uuidString.lowercased(), forKey: .userID)
        var period = c.nestedContainer(keyedBy: BoundsKeys.self, forKey: .period)
        try period.encode(Timestamp.format(periodStart), forKey: .start)
        try period.encode(Timestamp.format(periodEnd), forKey: .end)
        try c.encode(Int64(units), forKey: .units)
        try c.encode(inputTokens, forKey: .inputTokens)
        try c.encode(outputTokens, forKey: .outputTokens)
        try c.encode(method, forKey: .method)
        try c.encode(route, forKey: .route)
        try c.encode(model, forKey: .model)
        try c.encode(feature, forKey: .feature)
        try c.encode(outcome, forKey: .outcome)
        try c.encode(upstreamStatus.map(Int64.init), forKey: .upstreamStatus)
        try c.encode(requestID, forKey: .requestID)
        try c.encode(idempotencyKey, forKey: .idempotencyKey)
        try c.encode(settlement.rawValue, forKey: .settlement)
        try c.encode(cacheWriteTokens, forKey: .cacheWriteTokens)
        try c.encode(cacheReadTokens, forKey: .cacheReadTokens)
        try c.encode(hold?.decimal, forKey: .hold)
        try c.encode(cost?.decimal, forKey: .cost)
        try c.encode(costSource, forKey: .costSource)
    }
}

/// One day of the console's daily read: `{"date", "units", "features": {"<id>": units}}`, the
/// day in the company's time zone; a feature is listed once it has units that day.
public struct DailyUsage: Sendable, Equatable, Encodable {
    /// `YYYY-MM-DD`.
    public var date: String
    public var units: Int64
    public var features: [String: Int64]

    package init(date: String, units: Int64, features: [String: Int64]) {
        self.date = date
        self.units = units
        self.features = features
    }
}
