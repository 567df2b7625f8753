import Foundation
import Logging
import PostgresNIO

/// Plans, products, companies, users and API keys in PostgreSQL, returned as the SPEC §5 JSON
/// objects. SQLSTATE codes are mapped to domain errors here, at the repository edge.
public struct TenantStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    // MARK: plans

    static let planColumns = """
        id, name, monthly_company_cap, monthly_user_cap, price::text, currency, is_default, is_active, sort_order,
        monthly_company_budget, monthly_user_budget, company_rpm::bigint, company_tpm, user_rpm::bigint, user_tpm,
        user_concurrency::bigint
        """

    public func plans() async throws -> [PlanRecord] {
        try await database.run { client in
            var out: [PlanRecord] = []
            let rows = try await client.query(
                PostgresQuery(unsafeSQL: "SELECT \(Self.planColumns) FROM plans ORDER BY sort_order, id"), logger: logger)
            for try await row in rows {
                out.append(try PlanRecord(row: row.makeRandomAccess()))
            }
            return out
        }
    }

    public func plan(_ id: String) async throws -> PlanRecord? {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT \(unescaped: Self.planColumns) FROM plans WHERE id = \(id)", logger: logger
            )
            for try await row in rows {
                return try PlanRecord(row: row.makeRandomAccess())
            }
            return nil
        }
    }

    /// The fields of a plan as written by a create or an update.
    public struct PlanInput: Sendable {
        public var id: String
        public var name: String
        public var companyCap: Int64?
        public var userCap: Int64?
        /// At most 2 decimals (the column is `numeric(14,2)`): written as its decimal text, so
        /// nothing is rounded on the way.
        public var price: Decimal
        public var currency: String
        public var isDefault: Bool
        public var isActive: Bool
        public var sortOrder: Int32
        /// SPEC §11's budgets; nil: unlimited.
        public var companyBudget: Micros? = nil
        public var userBudget: Micros? = nil
        /// SPEC §14's per-minute and in-flight limits; nil each: none.
        public var rate = RateState.Limits()
    }

    /// Creates a plan. `is_default: true` makes it the default: the plan that was the default stops
    /// being it, in the same transaction (one default at most).
    public func createPlan(_ p: PlanInput, by actor: AuditActor? = nil) async throws -> PlanRecord? {
        do {
            try await database.audited(actor) { connection in
                if p.isDefault { try await Self.clearDefault(except: p.id, on: connection, logger: self.logger) }
                try await connection.query(
                    """
                    INSERT INTO plans (id, name, monthly_company_cap, monthly_user_cap, price, currency, is_default, is_active, sort_order,
                                       monthly_company_budget, monthly_user_budget, company_rpm, company_tpm, user_rpm, user_tpm,
                                       user_concurrency)
                    VALUES (\(p.id), \(p.name), \(p.companyCap), \(p.userCap), \(PlanRecord.text(p.price))::numeric, \(p.currency), \(p.isDefault), \(p.isActive), \(p.sortOrder),
                            \(p.companyBudget?.value), \(p.userBudget?.value), \(p.rate.companyRPM), \(p.rate.companyTPM),
                            \(p.rate.userRPM), \(p.rate.userTPM), \(p.rate.userConcurrency))
                    """,
                    logger: self.logger
                )
                let after = try await AuditLog.snapshot(AuditLog.plan(p.id), on: connection, logger: self.logger)
                return ((), AuditEntry(action: "plan.create", companyID: nil, targetID: p.id, before: nil, after: after))
            }
        } catch DatabaseError.constraint(let state, _, _) {
            guard state == "23505" else { throw GatewayError.invalidRequest("The plan's fields are not valid.") }
            throw GatewayError.conflict("A plan with id '\(p.id)' already exists.")
        }
        return try await plan(p.id)
    }

    /// Replaces a plan's fields; `is_default: true` moves the default to it, as in ``createPlan(_:)``.
    public func updatePlan(_ p: PlanInput, by actor: AuditActor? = nil) async throws -> PlanRecord? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.plan(p.id)), on: connection, logger: self.logger)
            if p.isDefault { try await Self.clearDefault(except: p.id, on: connection, logger: self.logger) }
            try await connection.query(
                """
                UPDATE plans SET name = \(p.name), monthly_company_cap = \(p.companyCap), monthly_user_cap = \(p.userCap),
                       price = \(PlanRecord.text(p.price))::numeric, currency = \(p.currency), is_default = \(p.isDefault),
                       is_active = \(p.isActive), sort_order = \(p.sortOrder), monthly_company_budget = \(p.companyBudget?.value),
                       monthly_user_budget = \(p.userBudget?.value), company_rpm = \(p.rate.companyRPM),
                       company_tpm = \(p.rate.companyTPM), user_rpm = \(p.rate.userRPM), user_tpm = \(p.rate.userTPM),
                       user_concurrency = \(p.rate.userConcurrency), updated_at = now()
                 WHERE id = \(p.id)
                """,
                logger: self.logger
            )
            let after = try await AuditLog.snapshot(AuditLog.plan(p.id), on: connection, logger: self.logger)
            return ((), AuditEntry(action: "plan.update", companyID: nil, targetID: p.id, before: before, after: after))
        }
        return try await plan(p.id)
    }

    /// The plan that is the default (other than `id`) stops being it. Two writers making different
    /// plans the default serialize on that row's lock; the last one to commit is the default.
    static func clearDefault(except id: String, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            "UPDATE plans SET is_default = false, updated_at = now() WHERE is_default AND id <> \(id)", logger: logger)
    }

    // MARK: products

    public func products() async throws -> [ProductRecord] {
        try await database.run { client in
            var out: [ProductRecord] = []
            let rows = try await client.query(
                "SELECT product_id, plan_id, interval, kind, units, budget_micros, valid_days FROM products ORDER BY product_id",
                logger: logger)
            for try await (product, plan, interval, kind, units, budget, days) in rows.decode(
                (String, String?, String?, String, Int64?, Int64?, Int32).self)
            {
                out.append(
                    ProductRecord(
                        productID: product, planID: plan, interval: interval, kind: ProductRecord.Kind(rawValue: kind) ?? .subscription,
                        units: units, budget: budget.map(Micros.init), validDays: Int64(days)))
            }
            return out
        }
    }

    /// Creates `product` (its fields checked by the route); a subscription's plan must exist.
    public func createProduct(_ product: ProductRecord, by actor: AuditActor? = nil) async throws -> ProductRecord {
        if let planID = product.planID, try await plan(planID) == nil {
            throw GatewayError.notFound("No plan with id '\(planID)'.")
        }
        let productID = product.productID
        do {
            try await database.audited(actor) { connection in
                try await connection.query(
                    """
                    INSERT INTO products (product_id, plan_id, interval, kind, units, budget_micros, valid_days)
                    VALUES (\(productID), \(product.planID), \(product.interval), \(product.kind.rawValue), \(product.units),
                            \(product.budget?.value), \(Int32(clamping: product.validDays)))
                    """,
                    logger: self.logger
                )
                let after = try await AuditLog.snapshot(AuditLog.product(productID), on: connection, logger: self.logger)
                return ((), AuditEntry(action: "product.create", companyID: nil, targetID: productID, before: nil, after: after))
            }
        } catch DatabaseError.constraint(let state, _, _) {
            guard state == "23505" else { throw GatewayError.invalidRequest("The product's fields are not valid.") }
            throw GatewayError.conflict("A product with id '\(productID)' already exists.")
        }
        return product
    }

    // MARK: companies

    /// The company object: id, name, plan, period, auto_renew of the period that contains now, or
    /// when none does, of the last one that started if it renews (ended, with no call since: its
    /// next call's admission or the rollover renews it on the same plan, SPEC §6); else null (no
    /// period yet, or the last one expired, was refunded or cancelled: no plan until one is set or
    /// the next call moves the company to the default plan).
    public func company(_ id: UUID, at: Date = Date()) async throws -> JSON? {
        try await database.run { client in
            try await Self.companyJSON(client.query(Self.companyQuery(id, at: at), logger: logger))
        }
    }

    /// The query behind the company object (also run inside billing transactions).
    static func companyQuery(_ id: UUID, at: Date) -> PostgresQuery {
        """
        SELECT c.id, c.name, c.created_at, pp.plan_id, pp.started_at, pp.ends_at, pp.auto_renew, c.time_zone, c.webhook_url
          FROM companies c
          LEFT JOIN LATERAL (SELECT l.* FROM (SELECT p.plan_id, p.started_at, p.ends_at, p.auto_renew, p.status
                                                  FROM plan_periods p WHERE p.company_id = c.id AND p.started_at <= \(at)
                                                 ORDER BY p.started_at DESC LIMIT 1) l
                              WHERE l.ends_at > \(at) OR (l.auto_renew AND l.status NOT IN ('expired', 'cancelled'))) pp ON true
         WHERE c.id = \(id)
        """
    }

    /// A row of ``companyQuery(_:at:)``: id, name, created_at, plan, period start and end,
    /// auto_renew, time_zone, webhook_url.
    package typealias CompanyRow = (UUID, String, Date, String?, Date?, Date?, Bool?, String, String?)

    /// The company object from ``companyQuery(_:at:)``'s rows; nil when there is none.
    static func companyJSON(_ rows: PostgresRowSequence) async throws -> JSON? {
        for try await r in rows.decode(CompanyRow.self) { return companyJSON(r) }
        return nil
    }

    /// The company object of one ``CompanyRow`` (also read inside the usage snapshot).
    package static func companyJSON(_ r: CompanyRow) -> JSON {
        .obj([
            "id": JSON(r.0), "name": .string(r.1), "plan": JSON(r.3),
            "period": r.4.flatMap { s in r.5.map { e in JSON.obj(["start": JSON(s), "end": JSON(e)]) } } ?? .null,
            "auto_renew": .bool(r.6 ?? false), "time_zone": .string(r.7), "webhook_url": JSON(r.8), "created_at": JSON(r.2),
        ])
    }

    /// The fields of a company that `PATCH /admin/v1/companies/{id}` changes; nil keeps a field.
    public struct CompanyChanges: Sendable {
        public var name: String?
        public var timeZone: String?
        /// `.some(nil)` removes the company's own URL (the configured one applies again).
        public var webhookURL: String??
    }

    /// Applies `changes`; false when there is no such company.
    public func updateCompany(_ id: UUID, _ changes: CompanyChanges, by actor: AuditActor? = nil) async throws -> Bool {
        let setURL = changes.webhookURL != nil
        let url = changes.webhookURL ?? nil
        return try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.company(id)), on: connection, logger: self.logger)
            guard before != nil else { return (false, nil) }
            try await connection.query(
                """
                UPDATE companies SET name = COALESCE(\(changes.name), name), time_zone = COALESCE(\(changes.timeZone), time_zone),
                       webhook_url = CASE WHEN \(setURL) THEN \(url) ELSE webhook_url END
                 WHERE id = \(id)
                """, logger: self.logger)
            let after = try await AuditLog.snapshot(AuditLog.company(id), on: connection, logger: self.logger)
            return (true, AuditEntry(action: "company.update", companyID: id, targetID: id.lowercased, before: before, after: after))
        }
    }

    /// Whether PostgreSQL knows `zone` as an IANA time zone name (the rules days are computed by).
    public func isTimeZone(_ zone: String) async throws -> Bool {
        try await database.run { client in
            try await !client.query("SELECT 1 FROM pg_timezone_names WHERE name = \(zone)", logger: logger).collect().isEmpty
        }
    }

    public func companyExists(_ id: UUID) async throws -> Bool {
        try await database.run { client in
            let rows = try await client.query("SELECT 1 FROM companies WHERE id = \(id)", logger: logger)
            for try await _ in rows { return true }
            return false
        }
    }

    // MARK: users

    static let userColumns = "id, company_id, email, role, monthly_cap, disabled, created_at, monthly_budget"

    /// A row of ``userColumns`` (the budget in micro-dollars).
    typealias UserRow = (UUID, UUID, String?, String, Int64?, Bool, Date, Int64?)

    public func user(company: UUID, id: UUID) async throws -> UserRecord? {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT \(unescaped: Self.userColumns) FROM users WHERE company_id = \(company) AND id = \(id)",
                logger: logger
            )
            for try await r in rows.decode(UserRow.self) { return UserRecord(r) }
            return nil
        }
    }

    public func users(company: UUID) async throws -> [UserRecord] {
        try await database.run { client in
            var out: [UserRecord] = []
            let rows = try await client.query(
                "SELECT \(unescaped: Self.userColumns) FROM users WHERE company_id = \(company) ORDER BY created_at, id",
                logger: logger
            )
            for try await r in rows.decode(UserRow.self) { out.append(UserRecord(r)) }
            return out
        }
    }

    public func createUser(
        company: UUID, id: UUID, email: String?, role: UserIdentity.Role, monthlyCap: Int64?, disabled: Bool, monthlyBudget: Micros? = nil,
        by actor: AuditActor? = nil
    ) async throws -> UserRecord? {
        do {
            try await database.audited(actor) { connection in
                try await connection.query(
                    """
                    INSERT INTO users (company_id, id, email, role, monthly_cap, disabled, monthly_budget)
                    VALUES (\(company), \(id), \(email), \(role.rawValue), \(monthlyCap), \(disabled), \(monthlyBudget?.value))
                    """,
                    logger: self.logger
                )
                let after = try await AuditLog.snapshot(AuditLog.user(company, id), on: connection, logger: self.logger)
                return ((), AuditEntry(action: "user.create", companyID: company, targetID: id.lowercased, before: nil, after: after))
            }
        } catch DatabaseError.constraint(let state, _, _) {
            guard state == "23505" else { throw GatewayError.invalidRequest("The user's fields are not valid.") }
            throw GatewayError.conflict("A user with id \(id.uuidString.lowercased()) already exists.")
        }
        return try await user(company: company, id: id)
    }

    public func updateUser(
        company: UUID, id: UUID, email: String??, role: UserIdentity.Role?, monthlyCap: Int64??, disabled: Bool?,
        monthlyBudget: Micros?? = nil, by actor: AuditActor? = nil
    ) async throws -> UserRecord? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.user(company, id)), on: connection, logger: self.logger)
            let setEmail = email != nil
            let setCap = monthlyCap != nil
            let setBudget = monthlyBudget != nil
            let budget = (monthlyBudget ?? nil)?.value
            try await connection.query(
                """
                UPDATE users SET
                    email = CASE WHEN \(setEmail) THEN \(email ?? nil) ELSE email END,
                    role = COALESCE(\(role?.rawValue), role),
                    monthly_cap = CASE WHEN \(setCap) THEN \(monthlyCap ?? nil) ELSE monthly_cap END,
                    monthly_budget = CASE WHEN \(setBudget) THEN \(budget) ELSE monthly_budget END,
                    disabled = COALESCE(\(disabled), disabled)
                 WHERE company_id = \(company) AND id = \(id)
                """,
                logger: self.logger
            )
            let after = try await AuditLog.snapshot(AuditLog.user(company, id), on: connection, logger: self.logger)
            return ((), AuditEntry(action: "user.update", companyID: company, targetID: id.lowercased, before: before, after: after))
        }
        return try await user(company: company, id: id)
    }
}
