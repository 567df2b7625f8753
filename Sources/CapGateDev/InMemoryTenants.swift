import CapGate
import Foundation

/// Companies, plans, periods, users, API keys and the ledger of charged calls as plain Swift
/// values: what `CapGateDev`'s in-memory stores (``InMemoryUsage``, ``InMemoryCredentials``)
/// answer the routes from, so the routes are tested through `app.test(.router)` with no database.
///
/// A company's and a user's `used` are summed from the ledger here (charged calls of the period),
/// where PostgreSQL keeps counters the admission writes; the two agree for a ledger written by
/// admissions. What only PostgreSQL models is listed on each store.
package struct InMemoryTenants: Sendable {
    package struct Company: Sendable {
        package var id: UUID
        package var name: String
        package var createdAt: Date
        /// The IANA zone the daily read counts days in.
        package var timeZone: String
        package var webhookURL: String?
        package var appAccountToken: UUID?
    }

    package struct Plan: Sendable {
        package var id: String
        package var name: String
        /// Nil: unlimited.
        package var companyCap: Int64?
        package var userCap: Int64?
        /// The plan's entitlements: feature id → period limit (nil: unlimited). A feature not
        /// listed is not the plan's (its limit reads 0, as a disabled entitlement's).
        package var features: [String: Int64?]
    }

    package struct Period: Sendable {
        package var companyID: UUID
        package var planID: String
        package var start: Date
        package var end: Date
        package var autoRenew: Bool
    }

    package struct User: Sendable {
        package var companyID: UUID
        package var id: UUID
        package var email: String?
        package var role: UserIdentity.Role
        /// The user's own cap, overriding the plan's per-user cap.
        package var cap: Int64?
        package var disabled: Bool
        package var createdAt: Date
    }

    package struct Key: Sendable {
        package var id: UUID
        package var companyID: UUID
        package var userID: UUID
        /// The key as its user sends it (`cg_…`); only its hash is compared.
        package var secret: String
        package var features: [String]?
        package var revokedAt: Date?
        package var expiresAt: Date?
    }

    /// One ledger row: a call admitted at `at`, charged (or given back when `refunded`).
    package struct Call: Sendable {
        /// The row id: its place in ``calls``, from 1, as a sequence gives them.
        package var id: Int64
        package var companyID: UUID
        package var userID: UUID
        package var at: Date
        package var units: Int32
        package var model: String?
        package var feature: String?
        package var refunded: Bool
        package var inputTokens: Int64?
        package var outputTokens: Int64?
        /// What the settled call cost; nil while it is not settled (its hold then counts as held).
        package var cost: Micros?
        package var hold: Micros?
    }

    package private(set) var companies: [Company] = []
    package private(set) var plans: [String: Plan] = [:]
    package private(set) var periods: [Period] = []
    package private(set) var users: [User] = []
    package private(set) var keys: [Key] = []
    package private(set) var calls: [Call] = []

    package init() {}

    /// A new company, created at `createdAt` (the overview's default order).
    @discardableResult
    package mutating func addCompany(
        _ name: String, id: UUID = UUID(), createdAt: Date, timeZone: String = "UTC", appAccountToken: UUID? = nil
    ) -> UUID {
        companies.append(
            Company(
                id: id, name: name, createdAt: createdAt, timeZone: timeZone, webhookURL: nil, appAccountToken: appAccountToken))
        return id
    }

    package mutating func addPlan(
        _ id: String, name: String, companyCap: Int64?, userCap: Int64? = nil, features: [String: Int64?] = [:]
    ) {
        plans[id] = Plan(id: id, name: name, companyCap: companyCap, userCap: userCap, features: features)
    }

    /// `company` on `plan` in `[start, end)`.
    package mutating func addPeriod(company: UUID, plan: String, start: Date, end: Date, autoRenew: Bool = true) {
        periods.append(Period(companyID: company, planID: plan, start: start, end: end, autoRenew: autoRenew))
    }

    @discardableResult
    package mutating func addUser(
        company: UUID, role: UserIdentity.Role, id: UUID = UUID(), email: String? = nil, cap: Int64? = nil, disabled: Bool = false,
        createdAt: Date
    ) -> UUID {
        users.append(
            User(companyID: company, id: id, email: email, role: role, cap: cap, disabled: disabled, createdAt: createdAt))
        return id
    }

    /// A key of `user`; `secret` is what the caller sends.
    package mutating func addKey(
        company: UUID, user: UUID, secret: String, features: [String]? = nil, revokedAt: Date? = nil, expiresAt: Date? = nil
    ) {
        keys.append(
            Key(
                id: UUID(), companyID: company, userID: user, secret: secret, features: features, revokedAt: revokedAt,
                expiresAt: expiresAt))
    }

    /// A ledger row; its id is the next of the sequence.
    @discardableResult
    package mutating func addCall(
        company: UUID, user: UUID, at: Date, units: Int32 = 1, model: String? = "claude-sonnet-4-5", feature: String? = nil,
        refunded: Bool = false, tokens: (input: Int64, output: Int64)? = nil, cost: Micros? = nil, hold: Micros? = nil
    ) -> Int64 {
        let id = Int64(calls.count + 1)
        calls.append(
            Call(
                id: id, companyID: company, userID: user, at: at, units: units, model: model, feature: feature, refunded: refunded,
                inputTokens: tokens?.input, outputTokens: tokens?.output, cost: cost, hold: hold))
        return id
    }

    // MARK: reads the stores share

    package func company(_ id: UUID) -> Company? { companies.first { $0.id == id } }

    /// The period of `company` containing `at` (the last to start when several do).
    func period(of company: UUID, at: Date) -> Period? {
        periods.filter { $0.companyID == company && $0.start <= at && $0.end > at }.max { $0.start < $1.start }
    }

    /// The charged (not refunded) calls of `company` in `period`, of `user` when given.
    func charged(_ company: UUID, in period: Period, user: UUID? = nil) -> [Call] {
        calls.filter {
            $0.companyID == company && !$0.refunded && $0.at >= period.start && $0.at < period.end && (user == nil || $0.userID == user)
        }
    }

    func units(_ calls: [Call]) -> Int64 { calls.reduce(0) { $0 + Int64($1.units) } }

    /// The users of `company`, in creation order.
    func users(of company: UUID) -> [User] {
        users.filter { $0.companyID == company }.sorted { ($0.createdAt, $0.id.uuidString) < ($1.createdAt, $1.id.uuidString) }
    }
}
