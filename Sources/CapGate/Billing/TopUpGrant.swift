import Foundation
import Logging
import PostgresNIO

/// What a top-up purchase granted a company (SPEC §12), as the usage reads list it: units and/or
/// a budget, what calls used of them, until `expiresAt`. Admission draws on a grant only for what
/// the plan cannot hold (`capgate_grant_take`).
public struct TopUpGrant: Sendable, Equatable {
    public var id: Int64
    public var productID: String
    /// Units granted (nil: the pack grants none).
    public var units: Int64?
    public var unitsUsed: Int64
    /// Budget granted (nil: the pack grants none).
    public var budget: Micros?
    /// The settled costs of the calls it paid.
    public var costUsed: Micros
    /// The holds of its calls not settled yet.
    public var costHeld: Micros
    public var grantedAt: Date
    public var expiresAt: Date
    /// When the pack was refunded (nil: it was not): what was left of it is gone.
    public var refundedAt: Date?

    /// Whether calls may still draw on it at `at`.
    public func isLive(at: Date) -> Bool { refundedAt == nil && expiresAt > at }

    /// Units left at `at` (nil: none granted; 0 once expired or refunded).
    public func remainingUnits(at: Date) -> Int64? {
        units.map { isLive(at: at) ? max(0, $0 - unitsUsed) : 0 }
    }

    /// Budget left at `at`: granted − used − held (nil: none granted; 0 once expired or refunded).
    public func remainingBudget(at: Date) -> Micros? {
        budget.map { Micros(isLive(at: at) ? max(0, $0.value - costUsed.value - costHeld.value) : 0) }
    }

    /// `{"id", "product_id", "granted", "used", "remaining", "expires_at", …}`: `granted`, `used`
    /// and `remaining` each `{"units", "budget"}` (units a number, budget a decimal string of USD,
    /// `null` where the pack grants none); `used.budget` is the settled costs plus the open holds
    /// (`held` gives the holds alone); `status` is `active`, `used_up`, `expired` or `refunded`.
    public func json(at: Date) -> JSON {
        let remainingUnits = remainingUnits(at: at)
        let remainingBudget = remainingBudget(at: at)
        let status: String =
            if refundedAt != nil {
                "refunded"
            } else if expiresAt <= at {
                "expired"
            } else if (remainingUnits ?? 0) == 0 && (remainingBudget?.value ?? 0) == 0 {
                "used_up"
            } else {
                "active"
            }
        func pair(_ units: Int64?, _ budget: Micros?) -> JSON {
            .obj(["units": JSON(units), "budget": budget.map { .string($0.decimal) } ?? .null])
        }
        return .object([
            .init("id", .int(id)), .init("product_id", .string(productID)),
            .init("granted", pair(units, budget)),
            .init("used", pair(units.map { _ in unitsUsed }, budget.map { _ in Micros(costUsed.value + costHeld.value) })),
            .init("held", budget.map { _ in .string(costHeld.decimal) } ?? .null),
            .init("remaining", pair(remainingUnits, remainingBudget)),
            .init("granted_at", JSON(grantedAt)), .init("expires_at", JSON(expiresAt)), .init("refunded_at", JSON(refundedAt)),
            .init("status", .string(status)),
        ])
    }

    /// The columns ``init(row:)`` reads, in its order.
    static let columns = """
        id, product_id, units, units_used, budget_micros, cost_used, cost_held, granted_at, expires_at, refunded_at
        """

    typealias Row = (Int64, String, Int64?, Int64, Int64?, Int64, Int64, Date, Date, Date?)

    init(row r: Row) {
        self.init(
            id: r.0, productID: r.1, units: r.2, unitsUsed: r.3, budget: r.4.map(Micros.init), costUsed: Micros(r.5),
            costHeld: Micros(r.6), grantedAt: r.7, expiresAt: r.8, refundedAt: r.9)
    }

    public init(
        id: Int64, productID: String, units: Int64?, unitsUsed: Int64, budget: Micros?, costUsed: Micros, costHeld: Micros,
        grantedAt: Date, expiresAt: Date, refundedAt: Date?
    ) {
        self.id = id
        self.productID = productID
        self.units = units
        self.unitsUsed = unitsUsed
        self.budget = budget
        self.costUsed = costUsed
        self.costHeld = costHeld
        self.grantedAt = grantedAt
        self.expiresAt = expiresAt
        self.refundedAt = refundedAt
    }

    /// Every grant of `company`, in the order admission draws on them (earliest expiry first).
    static func all(of company: UUID, on connection: PostgresConnection, logger: Logger) async throws -> [TopUpGrant] {
        let query: PostgresQuery = "SELECT \(unescaped: columns) FROM topup_grants WHERE company_id = \(company) ORDER BY expires_at, id"
        return try await connection.query(query, logger: logger).decode(Row.self).collect().map(TopUpGrant.init(row:))
    }
}

extension JSON {
    /// This object with `key` set to `value` (appended, replacing an earlier one); not an
    /// object: unchanged.
    func adding(_ key: String, _ value: JSON) -> JSON {
        guard case .object(var fields) = self else { return self }
        fields.removeAll { $0.key == key }
        fields.append(.init(key, value))
        return .object(fields)
    }
}
