import Foundation

/// A store product (SPEC §5, §12), as the operator API shows it: a subscription mapped to a plan
/// and an interval, or a top-up pack (no plan) that grants `units` and/or `budget` for
/// `validDays` from its purchase.
public struct ProductRecord: Sendable, Equatable {
    /// `subscription` or `topup`.
    public enum Kind: String, Sendable, Equatable {
        case subscription, topup
    }

    public var productID: String
    /// The plan a subscription maps to; nil for a top-up.
    public var planID: String?
    /// `month` or `year` for a subscription; nil for a top-up.
    public var interval: String?
    public var kind: Kind = .subscription
    /// The units a top-up grants (nil: none).
    public var units: Int64? = nil
    /// The budget a top-up grants (nil: none).
    public var budget: Micros? = nil
    /// How long a top-up's grant lasts from its purchase, in days (default 365).
    public var validDays: Int64 = 365

    public init(
        productID: String, planID: String?, interval: String?, kind: Kind = .subscription, units: Int64? = nil,
        budget: Micros? = nil, validDays: Int64 = 365
    ) {
        self.productID = productID
        self.planID = planID
        self.interval = interval
        self.kind = kind
        self.units = units
        self.budget = budget
        self.validDays = validDays
    }
}

extension ProductRecord: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, productID = "product_id", planID = "plan_id", interval, kind, units, budget, validDays = "valid_days"
    }

    /// `id` repeats `product_id` (a create answers with the created object's `id`); every key is
    /// always present (`null` where the kind has none).
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(productID, forKey: .id)
        try c.encode(productID, forKey: .productID)
        try c.encode(planID, forKey: .planID)
        try c.encode(interval, forKey: .interval)
        try c.encode(kind.rawValue, forKey: .kind)
        try c.encode(units, forKey: .units)
        try c.encode(budget, forKey: .budget)
        try c.encode(validDays, forKey: .validDays)
    }
}

/// A user of a company (SPEC §5).
public struct UserRecord: Sendable, Equatable {
    public var id: UUID
    public var companyID: UUID
    public var email: String?
    /// `member` or `admin`.
    public var role: String
    /// The user's own cap, overriding the plan's per-user cap; nil: the plan's.
    public var monthlyCap: Int64?
    /// The user's own budget (SPEC §11), overriding the plan's per-user budget; nil: the plan's.
    public var monthlyBudget: Micros?
    public var disabled: Bool
    public var createdAt: Date

    /// A row of ``TenantStore/UserRow``.
    init(_ r: TenantStore.UserRow) {
        self.init(
            id: r.0, companyID: r.1, email: r.2, role: r.3, monthlyCap: r.4, disabled: r.5, createdAt: r.6,
            monthlyBudget: r.7.map(Micros.init))
    }

    public init(
        id: UUID, companyID: UUID, email: String?, role: String, monthlyCap: Int64?, disabled: Bool, createdAt: Date,
        monthlyBudget: Micros? = nil
    ) {
        self.id = id
        self.companyID = companyID
        self.email = email
        self.role = role
        self.monthlyCap = monthlyCap
        self.monthlyBudget = monthlyBudget
        self.disabled = disabled
        self.createdAt = createdAt
    }
}

extension UserRecord: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, companyID = "company_id", email, role, monthlyCap = "monthly_cap", monthlyBudget = "monthly_budget", disabled
        case createdAt = "created_at"
    }

    /// Every key present (`null` for no email or no override); ids in lower case; the budget a
    /// decimal string of US dollars in its shortest form.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id.uuidString.lowercased(), forKey: .id)
        try c.encode(companyID.uuidString.lowercased(), forKey: .companyID)
        try c.encode(email, forKey: .email)
        try c.encode(role, forKey: .role)
        try c.encode(monthlyCap, forKey: .monthlyCap)
        try c.encode(monthlyBudget, forKey: .monthlyBudget)
        try c.encode(disabled, forKey: .disabled)
        try c.encode(Timestamp.format(createdAt), forKey: .createdAt)
    }
}

/// An API key (SPEC §5, §13): never its secret, except ``key`` in the answer that created it.
public struct ApiKeyRecord: Sendable, Equatable {
    public var id: UUID
    public var userID: UUID
    public var prefix: String
    public var createdAt: Date
    public var revokedAt: Date?
    /// The features it may be charged to (SPEC §8); nil: unbound.
    public var features: [String]?
    /// The key itself, only when just created (it is stored as a hash).
    public var key: String?
    /// A label for people; nil: none.
    public var name: String? = nil
    /// When it stops working (401 after); nil: never.
    public var expiresAt: Date? = nil
    /// When a call last used it, to the minute (written apart from the admission); nil: never.
    public var lastUsedAt: Date? = nil
}

extension ApiKeyRecord: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, userID = "user_id", prefix, createdAt = "created_at", revokedAt = "revoked_at", features, key, name
        case expiresAt = "expires_at", lastUsedAt = "last_used_at"
    }

    /// Every key present (`null` when not revoked, unbound, unnamed…), `key` only when there is one.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id.uuidString.lowercased(), forKey: .id)
        try c.encode(name, forKey: .name)
        try c.encode(userID.uuidString.lowercased(), forKey: .userID)
        try c.encode(prefix, forKey: .prefix)
        try c.encode(Timestamp.format(createdAt), forKey: .createdAt)
        try c.encode(expiresAt.map(Timestamp.format), forKey: .expiresAt)
        try c.encode(revokedAt.map(Timestamp.format), forKey: .revokedAt)
        try c.encode(lastUsedAt.map(Timestamp.format), forKey: .lastUsedAt)
        try c.encode(features, forKey: .features)
        try c.encodeIfPresent(key, forKey: .key)
    }
}
