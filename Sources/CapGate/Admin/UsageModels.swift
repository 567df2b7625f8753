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
}

extension CompanyUsage: Encodable {
    enum CodingKeys: String, CodingKey { case company, usage, features, users }

    /// `usage` and `features` are the hand-written objects the 402 body shares (``UsageState``,
    /// ``FeatureUsage``); the company's features appear at the top and inside `usage`.
    public func encode(to encoder: any Encoder) throws {
        let companyFeatures = JSON.array(features.map { $0.json(user: nil) })
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(company, forKey: .company)
        try c.encode(state.json(scope: "company", includeUser: false, features: companyFeatures), forKey: .usage)
        try c.encode(companyFeatures, forKey: .features)
        try c.encode(users, forKey: .users)
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

    /// `limit − used`, never below 0; `nil` when unlimited.
    public var remaining: Int64? { limit.map { max(0, $0 - used) } }

    public static func == (a: UserUsage, b: UserUsage) -> Bool {
        a.id == b.id && a.email == b.email && a.role == b.role && a.disabled == b.disabled && a.used == b.used
            && a.limit == b.limit && a.features.map { $0.used(by: a.id) } == b.features.map { $0.used(by: b.id) }
    }
}

extension UserUsage: Encodable {
    enum CodingKeys: String, CodingKey { case id, email, role, disabled, used, limit, remaining, features }

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
    }
}

/// `GET /v1/usage` (SPEC §4): the caller's `usage` object (scope `user`) with the plan's
/// features, read from one snapshot (``UsageStore/callerUsage(company:user:at:)``).
public struct CallerUsage: Sendable {
    public var user: UUID
    public var state: UsageState
    public var features: [FeatureUsage]
}

extension CallerUsage: Encodable {
    /// The SPEC §3 `usage` object, as the 402 body writes it (``UsageState/json(scope:includeUser:featureRefusal:features:)``).
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(state.json(scope: "user", features: .array(features.map { $0.json(user: user) })))
    }
}
