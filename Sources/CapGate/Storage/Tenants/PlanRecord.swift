import Foundation
import PostgresNIO

/// A plan as the operator API shows it (SPEC §5), read by ``TenantStore``.
public struct PlanRecord: Sendable, Equatable {
    public var id: String
    public var name: String
    /// `nil`: unlimited.
    public var monthlyCompanyCap: Int64?
    /// `nil`: unlimited.
    public var monthlyUserCap: Int64?
    /// Exact, at most 2 decimals (the column is `numeric(14,2)`); never a binary floating point.
    public var price: Decimal
    public var currency: String
    public var isDefault: Bool
    public var isActive: Bool
    public var sortOrder: Int32
    /// What the whole company may spend per period (SPEC §11); `nil`: unlimited.
    public var monthlyCompanyBudget: Micros?
    /// What each user may spend per period, unless the user has an override; `nil`: unlimited.
    public var monthlyUserBudget: Micros?
    /// SPEC §14's per-minute and in-flight limits (nil each: none).
    public var rate = RateState.Limits()

    /// A row of ``TenantStore/planColumns`` (the price read as `price::text`, so exactly).
    init(row r: PostgresRandomAccessRow) throws {
        let id: String = try r.column("id")
        let text: String = try r.column("price")
        guard let price = Self.decimal(text) else { throw DatabaseError.other("plan \(id): price '\(text)' is not a decimal") }
        self.init(
            id: id, name: try r.column("name"), monthlyCompanyCap: try r.column("monthly_company_cap"),
            monthlyUserCap: try r.column("monthly_user_cap"), price: price, currency: try r.column("currency"),
            isDefault: try r.column("is_default"), isActive: try r.column("is_active"), sortOrder: try r.column("sort_order"),
            monthlyCompanyBudget: try r.column("monthly_company_budget", as: Int64?.self).map(Micros.init),
            monthlyUserBudget: try r.column("monthly_user_budget", as: Int64?.self).map(Micros.init))
        rate = try RateState.Limits(columnsOf: r)
    }

    public init(
        id: String, name: String, monthlyCompanyCap: Int64?, monthlyUserCap: Int64?, price: Decimal, currency: String,
        isDefault: Bool, isActive: Bool, sortOrder: Int32, monthlyCompanyBudget: Micros? = nil, monthlyUserBudget: Micros? = nil
    ) {
        self.id = id
        self.name = name
        self.monthlyCompanyCap = monthlyCompanyCap
        self.monthlyUserCap = monthlyUserCap
        self.price = price
        self.currency = currency
        self.isDefault = isDefault
        self.isActive = isActive
        self.sortOrder = sortOrder
        self.monthlyCompanyBudget = monthlyCompanyBudget
        self.monthlyUserBudget = monthlyUserBudget
    }

    /// The value of a plain decimal text (`19.99`, `49.00`, `0`): digits with at most one `.`,
    /// nothing else (no sign, exponent or locale separator); nil otherwise.
    static func decimal(_ text: String) -> Decimal? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), parts.allSatisfy({ $0.allSatisfy { $0.isASCII && $0.isNumber } }),
            parts.contains(where: { !$0.isEmpty })
        else { return nil }
        return Decimal(string: text, locale: Locale(identifier: "en_US_POSIX"))
    }

    /// The text PostgreSQL reads back as exactly `price` (`numeric` input): no exponent, `.` as
    /// the separator.
    static func text(_ price: Decimal) -> String {
        price.description
    }
}

extension PlanRecord: Encodable {
    enum CodingKeys: String, CodingKey {
        case id, name, monthlyCompanyCap = "monthly_company_cap", monthlyUserCap = "monthly_user_cap", price, currency
        case isDefault = "is_default", isActive = "is_active", sortOrder = "sort_order"
        case monthlyCompanyBudget = "monthly_company_budget", monthlyUserBudget = "monthly_user_budget"
        case companyRPM = "company_rpm", companyTPM = "company_tpm", userRPM = "user_rpm", userTPM = "user_tpm"
        case userConcurrency = "user_concurrency"
    }

    /// Every field always present: an unlimited cap or budget is `null`, not left out (synthesised
    /// conformance would leave it out). The price is a JSON number of the same value (`49`,
    /// `49.5`, `19.99`), as the `Double` it replaces was written; a budget is a decimal string of
    /// US dollars in its shortest form (`"50"`, `"12.5"`, `"0.000001"`).
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(name, forKey: .name)
        try c.encode(monthlyCompanyCap, forKey: .monthlyCompanyCap)
        try c.encode(monthlyUserCap, forKey: .monthlyUserCap)
        try c.encode(price, forKey: .price)
        try c.encode(currency, forKey: .currency)
        try c.encode(isDefault, forKey: .isDefault)
        try c.encode(isActive, forKey: .isActive)
        try c.encode(Int64(sortOrder), forKey: .sortOrder)
        try c.encode(monthlyCompanyBudget, forKey: .monthlyCompanyBudget)
        try c.encode(monthlyUserBudget, forKey: .monthlyUserBudget)
        try c.encode(rate.companyRPM, forKey: .companyRPM)
        try c.encode(rate.companyTPM, forKey: .companyTPM)
        try c.encode(rate.userRPM, forKey: .userRPM)
        try c.encode(rate.userTPM, forKey: .userTPM)
        try c.encode(rate.userConcurrency, forKey: .userConcurrency)
    }
}
