import Foundation
import Hummingbird

/// SPEC §5: plans, products, companies, users, API keys and plan assignment, for the operator;
/// a company's own users and API keys for its admins too (SPEC §13). Every change is written
/// with its audit row (``AuditLog``), in one transaction.
struct OperatorRoutes {
    let tenants: TenantStore
    let periods: PeriodStore

    func register(on group: RouterGroup<AuthenticatedContext>) {
        registerPlans(on: group)
        registerProducts(on: group)
        registerCompanies(on: group)
        registerUsers(on: group)
        registerKeys(on: group)
    }

    /// `GET/POST /plans`, `GET/PUT /plans/{id}`.
    func registerPlans(on group: RouterGroup<AuthenticatedContext>) {
        group.get("plans") { _, context in
            try context.requireOperator()
            return try jsonResponse(encoding: ListPage(try await tenants.plans()))
        }
        group.post("plans") { request, context in
            try context.requireOperator()
            let fields = try await BodyFields.read(request, context: context)
            let input = try planInput(fields, id: nil, existing: nil)
            return try jsonResponse(encoding: try await tenants.createPlan(input, by: context.auditActor), status: .created)
        }
        group.get("plans/{id}") { _, context in
            try context.requireOperator()
            let id = context.parameters.get("id") ?? ""
            guard let plan = try await tenants.plan(id) else { throw GatewayError.notFound("No plan with id '\(id)'.") }
            return try jsonResponse(encoding: plan)
        }
        group.put("plans/{id}") { request, context in
            try context.requireOperator()
            let id = context.parameters.get("id") ?? ""
            guard let existing = try await tenants.plan(id) else { throw GatewayError.notFound("No plan with id '\(id)'.") }
            let fields = try await BodyFields.read(request, context: context)
            let input = try planInput(fields, id: id, existing: existing)
            return try jsonResponse(encoding: try await tenants.updatePlan(input, by: context.auditActor))
        }
    }

    /// `GET/POST /products`.
    func registerProducts(on group: RouterGroup<AuthenticatedContext>) {
        group.get("products") { _, context in
            try context.requireOperator()
            return try jsonResponse(encoding: ListPage(try await tenants.products()))
        }
        group.post("products") { request, context in
            try context.requireOperator()
            let fields = try await BodyFields.read(request, context: context)
            let product = try Self.productInput(fields)
            return try jsonResponse(encoding: try await tenants.createProduct(product, by: context.auditActor), status: .created)
        }
    }

    /// `POST /companies`, `GET/PATCH /companies/{id}`, `PUT /companies/{id}/plan`.
    func registerCompanies(on group: RouterGroup<AuthenticatedContext>) {
        group.post("companies") { request, context in
            try context.requireOperator()
            let fields = try await BodyFields.read(request, context: context)
            let id = try fields.uuid("id") ?? UUID()
            let name = try fields.requiredString("name")
            let plan = try fields.string("plan", maxLength: 64)
            let autoRenew = try fields.bool("auto_renew") ?? true
            let start = try fields.date("started_at") ?? Date()
            let timeZone = try await timeZone(fields) ?? "UTC"
            let webhookURL = try Self.webhookURL(fields) ?? nil
            if let plan, try await tenants.plan(plan) == nil {
                throw GatewayError.notFound("No plan with id '\(plan)'.")
            }
            try await periods.createCompany(
                id: id, name: name, plan: plan, start: start, autoRenew: autoRenew, timeZone: timeZone, webhookURL: webhookURL,
                by: context.auditActor)
            return jsonResponse(try await tenants.company(id) ?? .null, status: .created)
        }
        group.patch("companies/{id}") { request, context in
            try context.requireOperator()
            let id = try context.parameters.uuid("id", what: "company")
            let fields = try await BodyFields.read(request, context: context)
            for key in ["plan", "period", "auto_renew"] where fields.has(key) {
                throw GatewayError.invalidRequest("'\(key)' is changed with PUT /admin/v1/companies/{id}/plan, not here.")
            }
            if let bodyID = try fields.uuid("id"), bodyID != id {
                throw GatewayError.invalidRequest("'id' in the body does not match the company in the path.")
            }
            let changes = TenantStore.CompanyChanges(
                name: try fields.string("name"), timeZone: try await timeZone(fields), webhookURL: try Self.webhookURL(fields))
            guard try await tenants.updateCompany(id, changes, by: context.auditActor) else {
                throw GatewayError.notFound("No company with that id.")
            }
            return jsonResponse(try await tenants.company(id) ?? .null)
        }
        group.get("companies/{id}") { _, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            guard let company = try await tenants.company(id) else { throw GatewayError.notFound("No company with that id.") }
            return jsonResponse(company)
        }
        group.put("companies/{id}/plan") { request, context in
            try context.requireOperator()
            let id = try context.parameters.uuid("id", what: "company")
            let fields = try await BodyFields.read(request, context: context)
            let plan = try fields.requiredString("plan", maxLength: 64)
            let start = try fields.date("started_at") ?? Date()
            let autoRenew = try fields.bool("auto_renew") ?? true
            guard try await tenants.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            try await periods.assignPlan(company: id, plan: plan, start: start, autoRenew: autoRenew, by: context.auditActor)
            return jsonResponse(try await tenants.company(id) ?? .null)
        }
    }

    /// A company's users: `GET/POST /companies/{id}/users`, `PATCH /companies/{id}/users/{userId}`;
    /// the operator or an admin of that company (SPEC §13).
    func registerUsers(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies/{id}/users") { _, context in
            let id = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: id)
            guard try await tenants.companyExists(id) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(encoding: ListPage(try await tenants.users(company: id)))
        }
        group.post("companies/{id}/users") { request, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            let fields = try await BodyFields.read(request, context: context)
            let id = try fields.uuid("id") ?? UUID()
            let email = try fields.string("email", maxLength: 320)
            let role = try fields.role("role") ?? .member
            var cap: Int64? = nil
            if case .value(let v) = try fields.cap("monthly_cap") { cap = v }
            let budget = try fields.budget("monthly_budget", keeping: nil)
            let disabled = try fields.bool("disabled") ?? false
            guard try await tenants.companyExists(company) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(
                encoding: try await tenants.createUser(
                    company: company, id: id, email: email, role: role, monthlyCap: cap, disabled: disabled,
                    monthlyBudget: budget, by: context.auditActor),
                status: .created
            )
        }
        group.patch("companies/{id}/users/{userId}") { request, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            let user = try context.parameters.uuid("userId", what: "user")
            let fields = try await BodyFields.read(request, context: context)
            let role = try fields.role("role")
            var cap: Int64?? = nil
            switch try fields.cap("monthly_cap") {
            case .absent: cap = nil
            case .null: cap = .some(nil)
            case .value(let v): cap = .some(v)
            }
            var budget: Micros?? = nil
            switch try fields.budget("monthly_budget") {
            case .absent: budget = nil
            case .null: budget = .some(nil)
            case .value(let v): budget = .some(v)
            }
            var email: String?? = nil
            if fields.has("email") { email = .some(try fields.string("email", maxLength: 320)) }
            let disabled = try fields.bool("disabled")
            guard try await tenants.user(company: company, id: user) != nil else {
                throw GatewayError.notFound("No user with that id in this company.")
            }
            return try jsonResponse(
                encoding: try await tenants.updateUser(
                    company: company, id: user, email: email, role: role, monthlyCap: cap, disabled: disabled,
                    monthlyBudget: budget, by: context.auditActor)
            )
        }
    }

    /// A company's API keys (SPEC §5, §13): `GET/POST /companies/{id}/api-keys`,
    /// `DELETE /companies/{id}/api-keys/{keyId}`, `POST /companies/{id}/api-keys/{keyId}/rotate`;
    /// the operator or an admin of that company.
    func registerKeys(on group: RouterGroup<AuthenticatedContext>) {
        group.get("companies/{id}/api-keys") { _, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            guard try await tenants.companyExists(company) else { throw GatewayError.notFound("No company with that id.") }
            return try jsonResponse(encoding: ListPage(try await tenants.keys(company: company)))
        }
        group.post("companies/{id}/api-keys") { request, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            let fields = try await BodyFields.read(request, context: context)
            let user = try fields.uuid("user_id", required: true)!
            // Bound to features (SPEC §8): charged only to those; absent or null: unbound.
            let features = try fields.featureIDs("features", allowEmpty: true)
            let name = try fields.string("name", maxLength: 200)
            // A past `expires_at` is taken: the key exists and every call with it is 401 "expired"
            // (SPEC §13), as it will be once a future one passes.
            let expiresAt = try fields.date("expires_at")
            guard try await tenants.companyExists(company) else { throw GatewayError.notFound("No company with that id.") }
            guard try await tenants.user(company: company, id: user) != nil else {
                throw GatewayError.notFound("No user with that id in this company.")
            }
            try await FeatureStore(database: tenants.database).checkFeaturesExist(features, field: "features")
            let settings = TenantStore.KeySettings(features: features, name: name, expiresAt: expiresAt)
            return try jsonResponse(
                encoding: try await tenants.createKey(company: company, user: user, settings: settings, by: context.auditActor),
                status: .created)
        }
        group.delete("companies/{id}/api-keys/{keyId}") { _, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            let key = try context.parameters.uuid("keyId", what: "API key")
            guard let revoked = try await tenants.revokeKey(company: company, id: key, by: context.auditActor) else {
                throw GatewayError.notFound("No API key with that id in this company.")
            }
            return try jsonResponse(encoding: revoked)
        }
        group.post("companies/{id}/api-keys/{keyId}/rotate") { request, context in
            let company = try context.parameters.uuid("id", what: "company")
            try context.requireAdmin(of: company)
            let key = try context.parameters.uuid("keyId", what: "API key")
            // No body is `{}`: the default grace (SPEC §13).
            let fields = try await BodyFields.read(request, context: context, emptyIsObject: true)
            let grace = try fields.int("grace_seconds", range: 0...(86400 * 90)) ?? 86400
            do {
                let fresh = try await tenants.rotateKey(company: company, id: key, grace: grace, by: context.auditActor)
                return try jsonResponse(encoding: fresh, status: .created)
            } catch TenantStore.RotateRefusal.unknown {
                throw GatewayError.notFound("No API key with that id in this company.")
            } catch TenantStore.RotateRefusal.revoked {
                throw GatewayError.conflict("This API key was revoked; create a new key instead.")
            } catch TenantStore.RotateRefusal.expired {
                throw GatewayError.conflict("This API key has expired; create a new key instead.")
            }
        }
    }

    /// `time_zone`: an IANA name PostgreSQL knows (days are computed by its rules); nil when absent.
    func timeZone(_ fields: BodyFields) async throws -> String? {
        guard let zone = try fields.string("time_zone", maxLength: 64) else {
            if fields.has("time_zone") { throw GatewayError.invalidRequest("'time_zone' cannot be null; UTC is 'UTC'.") }
            return nil
        }
        guard try await tenants.isTimeZone(zone) else {
            throw GatewayError.invalidRequest("'time_zone' must be an IANA time zone name such as Europe/Berlin or UTC; '\(zone)' is not.")
        }
        return zone
    }

    /// `webhook_url`: nil when absent, `.some(nil)` for `null` (the configured URL applies), else an
    /// absolute http(s) URL with a host and no user name or password (the signature is the
    /// receiver's proof, not a password in the URL).
    static func webhookURL(_ fields: BodyFields) throws -> String?? {
        guard fields.has("webhook_url") else { return nil }
        guard let text = try fields.string("webhook_url", maxLength: 2000) else { return .some(nil) }
        guard text.hasPrefix("http://") || text.hasPrefix("https://"), let url = URLComponents(string: text),
            let host = url.host, !host.isEmpty, url.user == nil, url.password == nil, url.fragment == nil,
            !text.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value >= 0x7f })
        else {
            throw GatewayError.invalidRequest(
                "'webhook_url' must be an absolute http:// or https:// URL with a host, without a user name, password or fragment.")
        }
        return .some(text)
    }

    static let slugRule = "a slug: lowercase letters, digits, '-', '_' or '.'"

    /// `^[a-z0-9][a-z0-9_.-]{0,63}$`, checked character by character.
    static func isSlug(_ s: String) -> Bool {
        let scalars = Array(s.unicodeScalars)
        guard (1...64).contains(scalars.count) else { return false }
        func allowed(_ c: Unicode.Scalar, first: Bool) -> Bool {
            ("a"..."z").contains(c) || ("0"..."9").contains(c) || (!first && (c == "_" || c == "." || c == "-"))
        }
        return scalars.enumerated().allSatisfy { allowed($0.element, first: $0.offset == 0) }
    }

    /// Reads a plan body; for an update, missing fields keep their current values.
    func planInput(_ f: BodyFields, id: String?, existing: PlanRecord?) throws -> TenantStore.PlanInput {
        let planID = try f.resourceID(path: id, what: "plan", isValid: Self.isSlug, rule: Self.slugRule)
        let name = try f.string("name") ?? existing?.name
        guard let name else { throw GatewayError.invalidRequest("'name' is required.") }
        let currency = try f.string("currency", maxLength: 3)?.uppercased() ?? existing?.currency ?? "USD"
        guard currency.count == 3, currency.allSatisfy({ $0.isLetter && $0.isASCII }) else {
            throw GatewayError.invalidRequest("'currency' must be a three-letter ISO 4217 code such as USD.")
        }
        return TenantStore.PlanInput(
            id: planID,
            name: name,
            companyCap: try f.cap("monthly_company_cap", keeping: existing?.monthlyCompanyCap),
            userCap: try f.cap("monthly_user_cap", keeping: existing?.monthlyUserCap),
            price: try f.money("price") ?? existing?.price ?? 0,
            currency: currency,
            isDefault: try f.bool("is_default") ?? existing?.isDefault ?? false,
            isActive: try f.bool("is_active") ?? existing?.isActive ?? true,
            sortOrder: try f.int("sort_order", range: -1_000_000...1_000_000).map { Int32($0) } ?? existing?.sortOrder ?? 0,
            companyBudget: try f.budget("monthly_company_budget", keeping: existing?.monthlyCompanyBudget),
            userBudget: try f.budget("monthly_user_budget", keeping: existing?.monthlyUserBudget),
            rate: try f.rateLimits(keeping: existing?.rate ?? RateState.Limits())
        )
    }
}
