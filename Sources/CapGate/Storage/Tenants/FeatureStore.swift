import Foundation
import Logging
import PostgresNIO

/// Features, plan entitlements and the route table (SPEC §8) in PostgreSQL, returned as the
/// operator API's JSON objects. SQLSTATE codes are mapped to domain errors here, at the
/// repository edge. A route change bumps `config_versions.routes` (a trigger), so every gateway
/// matches the next call against the new table.
struct FeatureStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    // MARK: features

    /// A feature as written by a create or an update.
    struct FeatureInput: Sendable {
        var id: String
        var name: String
        var isActive: Bool
        var sortOrder: Int32
    }

    static func featureJSON(_ r: (String, String, Bool, Int32)) -> JSON {
        .obj(["id": .string(r.0), "name": .string(r.1), "is_active": .bool(r.2), "sort_order": .int(Int64(r.3))])
    }

    /// Every feature, by `sort_order` then `id`.
    func features() async throws -> [JSON] {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT id, name, is_active, sort_order FROM features ORDER BY sort_order, id", logger: logger)
            return try await rows.decode((String, String, Bool, Int32).self).collect().map(Self.featureJSON)
        }
    }

    func feature(_ id: String) async throws -> JSON? {
        try await database.run { client in
            let rows = try await client.query("SELECT id, name, is_active, sort_order FROM features WHERE id = \(id)", logger: logger)
            return try await rows.decode((String, String, Bool, Int32).self).collect().first.map(Self.featureJSON)
        }
    }

    func createFeature(_ f: FeatureInput, by actor: AuditActor? = nil) async throws -> JSON {
        do {
            try await database.audited(actor) { connection in
                try await connection.query(
                    "INSERT INTO features (id, name, is_active, sort_order) VALUES (\(f.id), \(f.name), \(f.isActive), \(f.sortOrder))",
                    logger: logger)
                let after = try await AuditLog.snapshot(AuditLog.feature(f.id), on: connection, logger: logger)
                return ((), AuditEntry(action: "feature.create", companyID: nil, targetID: f.id, before: nil, after: after))
            }
        } catch DatabaseError.constraint(let state, _, _) {
            guard state == "23505" else { throw GatewayError.invalidRequest("The feature's fields are not valid.") }
            throw GatewayError.conflict("A feature with id '\(f.id)' already exists.")
        }
        return try await feature(f.id) ?? .null
    }

    /// Replaces a feature's name, `is_active` and `sort_order`; nil when there is no such feature.
    func updateFeature(_ f: FeatureInput, by actor: AuditActor? = nil) async throws -> JSON? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.feature(f.id)), on: connection, logger: logger)
            let rows = try await connection.query(
                """
                UPDATE features SET name = \(f.name), is_active = \(f.isActive), sort_order = \(f.sortOrder), updated_at = now()
                 WHERE id = \(f.id) RETURNING id, name, is_active, sort_order
                """, logger: logger)
            guard let updated = try await rows.decode((String, String, Bool, Int32).self).collect().first.map(Self.featureJSON) else {
                return (nil, nil)
            }
            let after = try await AuditLog.snapshot(AuditLog.feature(f.id), on: connection, logger: logger)
            return (updated, AuditEntry(action: "feature.update", companyID: nil, targetID: f.id, before: before, after: after))
        }
    }

    /// The ids of `ids` that name no feature (in their order): a binding or a route's
    /// `header_features` may only list features that exist. Features are never deleted.
    func unknownFeatures(_ ids: [String]) async throws -> [String] {
        guard !ids.isEmpty else { return [] }
        let known = try await database.run { client in
            try await client.query("SELECT id FROM features WHERE id = ANY (\(ids))", logger: logger).decode(String.self).collect()
        }
        return ids.filter { !known.contains($0) }
    }

    /// The 400 naming the ids of `ids` that are not features, if any.
    func checkFeaturesExist(_ ids: [String]?, field: String) async throws {
        let unknown = try await unknownFeatures(ids ?? [])
        guard unknown.isEmpty else {
            throw GatewayError.invalidRequest(
                "'\(field)' names no feature: \(unknown.map { "'\($0)'" }.joined(separator: ", ")). Create it first.")
        }
    }

    // MARK: entitlements

    /// One plan × one feature; nil limits are unlimited.
    struct EntitlementInput: Sendable {
        var plan: String
        var feature: String
        var enabled: Bool
        var dailyLimit: Int64?
        var periodLimit: Int64?
        var userDailyLimit: Int64?
        var userPeriodLimit: Int64?
        var message: String?
        /// SPEC §14's limits for the calls of this feature; nil each: none.
        var rate = RateState.Limits()
    }

    static let entitlementColumns = """
        plan_id, feature_id, enabled, daily_limit, period_limit, user_daily_limit, user_period_limit, message, company_rpm::bigint,
        company_tpm, user_rpm::bigint, user_tpm, user_concurrency::bigint
        """

    /// A row of ``entitlementColumns``, read by name.
    static func entitlementJSON(_ row: PostgresRow) throws -> JSON {
        let r = row.makeRandomAccess()
        let rate = try RateState.Limits(columnsOf: r)
        return .obj([
            "plan_id": .string(try r.column("plan_id")), "feature_id": .string(try r.column("feature_id")),
            "enabled": .bool(try r.column("enabled")), "daily_limit": JSON(try r.column("daily_limit", as: Int64?.self)),
            "period_limit": JSON(try r.column("period_limit", as: Int64?.self)),
            "user_daily_limit": JSON(try r.column("user_daily_limit", as: Int64?.self)),
            "user_period_limit": JSON(try r.column("user_period_limit", as: Int64?.self)),
            "message": JSON(try r.column("message", as: String?.self)), "company_rpm": JSON(rate.companyRPM),
            "company_tpm": JSON(rate.companyTPM), "user_rpm": JSON(rate.userRPM), "user_tpm": JSON(rate.userTPM),
            "user_concurrency": JSON(rate.userConcurrency),
        ])
    }

    /// The plan's entitlements, in the features' order.
    func entitlements(plan: String) async throws -> [JSON] {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT pf.plan_id, pf.feature_id, pf.enabled, pf.daily_limit, pf.period_limit, pf.user_daily_limit,
                       pf.user_period_limit, pf.message, pf.company_rpm::bigint, pf.company_tpm, pf.user_rpm::bigint, pf.user_tpm,
                       pf.user_concurrency::bigint
                  FROM plan_features pf JOIN features f ON f.id = pf.feature_id
                 WHERE pf.plan_id = \(plan) ORDER BY f.sort_order, f.id
                """, logger: logger)
            return try await rows.collect().map(Self.entitlementJSON)
        }
    }

    func entitlement(plan: String, feature: String) async throws -> JSON? {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT \(unescaped: Self.entitlementColumns) FROM plan_features WHERE plan_id = \(plan) AND feature_id = \(feature)",
                logger: logger)
            return try await rows.collect().first.map(Self.entitlementJSON)
        }
    }

    /// Creates or replaces the entitlement. An unknown plan or feature is 404.
    func putEntitlement(_ e: EntitlementInput, by actor: AuditActor? = nil) async throws -> JSON {
        do {
            return try await database.audited(actor) { connection in
                let target = AuditLog.entitlement(e.plan, e.feature)
                let before = try await AuditLog.snapshot(AuditLog.locked(target), on: connection, logger: logger)
                let rows = try await connection.query(
                    """
                    INSERT INTO plan_features (plan_id, feature_id, enabled, daily_limit, period_limit, user_daily_limit, user_period_limit, message,
                                               company_rpm, company_tpm, user_rpm, user_tpm, user_concurrency)
                    VALUES (\(e.plan), \(e.feature), \(e.enabled), \(e.dailyLimit), \(e.periodLimit), \(e.userDailyLimit), \(e.userPeriodLimit), \(e.message),
                            \(e.rate.companyRPM), \(e.rate.companyTPM), \(e.rate.userRPM), \(e.rate.userTPM), \(e.rate.userConcurrency))
                    ON CONFLICT (plan_id, feature_id) DO UPDATE SET
                        enabled = EXCLUDED.enabled, daily_limit = EXCLUDED.daily_limit, period_limit = EXCLUDED.period_limit,
                        user_daily_limit = EXCLUDED.user_daily_limit, user_period_limit = EXCLUDED.user_period_limit,
                        message = EXCLUDED.message, company_rpm = EXCLUDED.company_rpm, company_tpm = EXCLUDED.company_tpm,
                        user_rpm = EXCLUDED.user_rpm, user_tpm = EXCLUDED.user_tpm, user_concurrency = EXCLUDED.user_concurrency,
                        updated_at = now()
                    RETURNING \(unescaped: Self.entitlementColumns)
                    """, logger: logger)
                let stored = try await rows.collect().first.map(Self.entitlementJSON) ?? .null
                let after = try await AuditLog.snapshot(target, on: connection, logger: logger)
                return (
                    stored,
                    AuditEntry(action: "entitlement.put", companyID: nil, targetID: "\(e.plan)/\(e.feature)", before: before, after: after)
                )
            }
        } catch DatabaseError.constraint(let state, let constraint, _) {
            guard state == "23503" else { throw GatewayError.invalidRequest("The entitlement's fields are not valid.") }
            if constraint == "plan_features_plan_id_fkey" { throw GatewayError.notFound("No plan with id '\(e.plan)'.") }
            throw GatewayError.notFound("No feature with id '\(e.feature)'.")
        }
    }

    /// Removes the entitlement (the feature leaves the plan) and returns it; nil when there was none.
    func deleteEntitlement(plan: String, feature: String, by actor: AuditActor? = nil) async throws -> JSON? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.entitlement(plan, feature)), on: connection, logger: logger)
            let rows = try await connection.query(
                """
                DELETE FROM plan_features WHERE plan_id = \(plan) AND feature_id = \(feature)
                RETURNING \(unescaped: Self.entitlementColumns)
                """, logger: logger)
            guard let removed = try await rows.collect().first.map(Self.entitlementJSON) else {
                return (nil, nil)
            }
            return (
                removed,
                AuditEntry(action: "entitlement.delete", companyID: nil, targetID: "\(plan)/\(feature)", before: before, after: nil)
            )
        }
    }

    func planExists(_ id: String) async throws -> Bool {
        try await database.run { client in
            try await !client.query("SELECT 1 FROM plans WHERE id = \(id)", logger: logger).collect().isEmpty
        }
    }

    // MARK: routes

    /// A route as written by a create or an update; `method` upper case or `*`.
    struct RouteInput: Sendable {
        var id: String
        var method: String
        var path: String
        var units: Int32
        var itemsField: String?
        var feature: String?
        var featureHeader: Bool
        /// The only features the header may name; nil: any.
        var headerFeatures: [String]?
        var allowed: Bool
    }

    static let routeColumns = "id, method, path, units, items_field, feature, feature_header, allowed, header_features"
    typealias RouteRow = (String, String, String, Int32, String?, String?, Bool, Bool, [String]?)

    static func routeJSON(_ r: RouteRow) -> JSON {
        .obj([
            "id": .string(r.0), "method": .string(r.1), "path": .string(r.2), "units": .int(Int64(r.3)), "items_field": JSON(r.4),
            "feature": JSON(r.5), "feature_header": .bool(r.6), "header_features": r.8.map { .array($0.map(JSON.string)) } ?? .null,
            "allowed": .bool(r.7),
        ])
    }

    /// Every route, by path then method.
    func routes() async throws -> [JSON] {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT \(unescaped: Self.routeColumns) FROM routes ORDER BY path, method, id", logger: logger)
            return try await rows.decode(RouteRow.self).collect().map(Self.routeJSON)
        }
    }

    func route(_ id: String) async throws -> JSON? {
        try await database.run { client in
            let rows = try await client.query(
                "SELECT \(unescaped: Self.routeColumns) FROM routes WHERE id = \(id)", logger: logger)
            return try await rows.decode(RouteRow.self).collect().first.map(Self.routeJSON)
        }
    }

    func createRoute(_ r: RouteInput, by actor: AuditActor? = nil) async throws -> JSON {
        try await writeRoute(r, action: "route.create", by: actor) { client in
            try await client.query(
                """
                INSERT INTO routes (id, method, path, units, items_field, feature, feature_header, allowed, header_features)
                VALUES (\(r.id), \(r.method), \(r.path), \(r.units), \(r.itemsField), \(r.feature), \(r.featureHeader), \(r.allowed),
                        \(r.headerFeatures))
                RETURNING \(unescaped: Self.routeColumns)
                """, logger: logger)
        } ?? .null
    }

    /// Replaces a route's fields; nil when there is no such route.
    func updateRoute(_ r: RouteInput, by actor: AuditActor? = nil) async throws -> JSON? {
        try await writeRoute(r, action: "route.update", by: actor) { client in
            try await client.query(
                """
                UPDATE routes SET method = \(r.method), path = \(r.path), units = \(r.units), items_field = \(r.itemsField),
                       feature = \(r.feature), feature_header = \(r.featureHeader), allowed = \(r.allowed),
                       header_features = \(r.headerFeatures), updated_at = now()
                 WHERE id = \(r.id)
                RETURNING \(unescaped: Self.routeColumns)
                """, logger: logger)
        }
    }

    /// false when there was no such route.
    func deleteRoute(_ id: String, by actor: AuditActor? = nil) async throws -> Bool {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.route(id)), on: connection, logger: logger)
            guard before != nil else { return (false, nil) }
            try await connection.query("DELETE FROM routes WHERE id = \(id)", logger: logger)
            return (true, AuditEntry(action: "route.delete", companyID: nil, targetID: id, before: before, after: nil))
        }
    }

    /// Runs an insert or update of a route, mapping a duplicate id or (method, path) to 409 and an
    /// unknown feature to 400.
    private func writeRoute(
        _ r: RouteInput, action: String, by actor: AuditActor?,
        _ statement: @escaping @Sendable (PostgresConnection) async throws -> PostgresRowSequence
    ) async throws -> JSON? {
        do {
            return try await database.audited(actor) { connection in
                let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.route(r.id)), on: connection, logger: logger)
                guard let written = try await statement(connection).decode(RouteRow.self).collect().first.map(Self.routeJSON) else {
                    return (nil, nil)
                }
                let after = try await AuditLog.snapshot(AuditLog.route(r.id), on: connection, logger: logger)
                return (written, AuditEntry(action: action, companyID: nil, targetID: r.id, before: before, after: after))
            }
        } catch DatabaseError.constraint(let state, let constraint, _) {
            switch state {
            case "23505" where constraint == "routes_pkey":
                throw GatewayError.conflict("A route with id '\(r.id)' already exists.")
            case "23505":
                throw GatewayError.conflict("A route for \(r.method) \(r.path) already exists; change that route instead.")
            case "23503":
                throw GatewayError.invalidRequest("'feature' names no feature: '\(r.feature ?? "")'. Create it first.")
            default:
                throw GatewayError.invalidRequest("The route's fields are not valid.")
            }
        }
    }
}
