import Foundation
import Hummingbird

/// SPEC §8, the operator's half: features, plan entitlements and the route table. Every write
/// is read by the next admission (entitlements and features are joined in the admission
/// function; a route change bumps the routes version every admission checks).
///
/// `PUT` on a feature, an entitlement or a route keeps the current value of a field the body
/// leaves out (as `PUT /admin/v1/plans/{id}` does); `null` sets a limit to unlimited.
struct FeatureRoutes {
    let features: FeatureStore
    /// The forward prefix (`proxy.prefix`): a route outside it could never match a call.
    let prefix: String

    func register(on group: RouterGroup<AuthenticatedContext>) {
        registerFeatures(on: group)
        registerEntitlements(on: group)
        registerRoutes(on: group)
    }

    // MARK: features

    private func registerFeatures(on group: RouterGroup<AuthenticatedContext>) {
        group.get("features") { _, context in
            try context.requireOperator()
            return jsonResponse(listJSON(try await features.features()))
        }
        group.post("features") { request, context in
            try context.requireOperator()
            let input = try Self.featureInput(try await BodyFields.read(request, context: context), id: nil, existing: nil)
            return jsonResponse(try await features.createFeature(input, by: context.auditActor), status: .created)
        }
        group.get("features/{id}") { _, context in
            try context.requireOperator()
            return jsonResponse(try await existingFeature(context))
        }
        group.put("features/{id}") { request, context in
            try context.requireOperator()
            let existing = try await existingFeature(context)
            let fields = try await BodyFields.read(request, context: context)
            let input = try Self.featureInput(fields, id: existing["id"]?.stringValue, existing: existing)
            guard let updated = try await features.updateFeature(input, by: context.auditActor) else { throw Self.noFeature(input.id) }
            return jsonResponse(updated)
        }
    }

    private func existingFeature(_ context: AuthenticatedContext) async throws -> JSON {
        let id = context.parameters.get("id") ?? ""
        guard let feature = try await features.feature(id) else { throw Self.noFeature(id) }
        return feature
    }

    static func noFeature(_ id: String) -> GatewayError { .notFound("No feature with id '\(id)'.") }

    /// A feature body; for an update, missing fields keep their current values.
    static func featureInput(_ f: BodyFields, id: String?, existing: JSON?) throws -> FeatureStore.FeatureInput {
        let featureID = try f.resourceID(path: id, what: "feature", isValid: OperatorRoutes.isSlug, rule: OperatorRoutes.slugRule)
        guard let name = try f.string("name") ?? existing?["name"]?.stringValue else {
            throw GatewayError.invalidRequest("'name' is required.")
        }
        return FeatureStore.FeatureInput(
            id: featureID, name: name,
            isActive: try f.bool("is_active") ?? existing?["is_active"]?.boolValue ?? true,
            sortOrder: Int32(try f.int("sort_order", range: -1_000_000...1_000_000) ?? existing?["sort_order"]?.intValue ?? 0))
    }

    // MARK: entitlements

    private func registerEntitlements(on group: RouterGroup<AuthenticatedContext>) {
        group.get("plans/{id}/entitlements") { _, context in
            try context.requireOperator()
            let plan = context.parameters.get("id") ?? ""
            guard try await features.planExists(plan) else { throw GatewayError.notFound("No plan with id '\(plan)'.") }
            return jsonResponse(listJSON(try await features.entitlements(plan: plan)))
        }
        group.put("plans/{id}/entitlements/{featureId}") { request, context in
            try context.requireOperator()
            let plan = context.parameters.get("id") ?? ""
            let feature = context.parameters.get("featureId") ?? ""
            let fields = try await BodyFields.read(request, context: context)
            let existing = try await features.entitlement(plan: plan, feature: feature)
            let input = try Self.entitlementInput(fields, plan: plan, feature: feature, existing: existing)
            let stored = try await features.putEntitlement(input, by: context.auditActor)
            return jsonResponse(stored, status: existing == nil ? .created : .ok)
        }
        group.delete("plans/{id}/entitlements/{featureId}") { _, context in
            try context.requireOperator()
            let plan = context.parameters.get("id") ?? ""
            let feature = context.parameters.get("featureId") ?? ""
            guard let removed = try await features.deleteEntitlement(plan: plan, feature: feature, by: context.auditActor) else {
                throw GatewayError.notFound("Plan '\(plan)' has no entitlement for feature '\(feature)'.")
            }
            return jsonResponse(removed)
        }
    }

    /// An entitlement body. A new entitlement is enabled and unlimited where the body is silent;
    /// an existing one keeps what the body leaves out.
    static func entitlementInput(_ f: BodyFields, plan: String, feature: String, existing: JSON?) throws -> FeatureStore.EntitlementInput {
        for (key, value) in [("plan_id", plan), ("feature_id", feature)] {
            if let inBody = try f.string(key, maxLength: 64), inBody != value {
                throw GatewayError.invalidRequest("'\(key)' in the body does not match the path.")
            }
        }
        var message = existing?["message"]?.stringValue
        if f.has("message") { message = try f.string("message", maxLength: 1000) }
        return FeatureStore.EntitlementInput(
            plan: plan, feature: feature,
            enabled: try f.bool("enabled") ?? existing?["enabled"]?.boolValue ?? true,
            dailyLimit: try f.cap("daily_limit", keeping: existing), periodLimit: try f.cap("period_limit", keeping: existing),
            userDailyLimit: try f.cap("user_daily_limit", keeping: existing),
            userPeriodLimit: try f.cap("user_period_limit", keeping: existing),
            message: message,
            rate: try f.rateLimits(
                keeping: RateState.Limits(
                    companyRPM: existing?["company_rpm"]?.intValue, companyTPM: existing?["company_tpm"]?.intValue,
                    userRPM: existing?["user_rpm"]?.intValue, userTPM: existing?["user_tpm"]?.intValue,
                    userConcurrency: existing?["user_concurrency"]?.intValue)))
    }

    // MARK: routes

    private func registerRoutes(on group: RouterGroup<AuthenticatedContext>) {
        group.get("routes") { _, context in
            try context.requireOperator()
            return jsonResponse(listJSON(try await features.routes()))
        }
        group.post("routes") { request, context in
            try context.requireOperator()
            let input = try routeInput(try await BodyFields.read(request, context: context), id: nil, existing: nil)
            try await features.checkFeaturesExist(input.headerFeatures, field: "header_features")
            return jsonResponse(try await features.createRoute(input, by: context.auditActor), status: .created)
        }
        group.get("routes/{id}") { _, context in
            try context.requireOperator()
            return jsonResponse(try await existingRoute(context))
        }
        group.put("routes/{id}") { request, context in
            try context.requireOperator()
            let existing = try await existingRoute(context)
            let input = try routeInput(
                try await BodyFields.read(request, context: context), id: existing["id"]?.stringValue, existing: existing)
            try await features.checkFeaturesExist(input.headerFeatures, field: "header_features")
            guard let updated = try await features.updateRoute(input, by: context.auditActor) else { throw Self.noRoute(input.id) }
            return jsonResponse(updated)
        }
        group.delete("routes/{id}") { _, context in
            try context.requireOperator()
            let route = try await existingRoute(context)
            guard try await features.deleteRoute(route["id"]?.stringValue ?? "", by: context.auditActor) else {
                throw Self.noRoute(route["id"]?.stringValue ?? "")
            }
            return jsonResponse(route)
        }
    }

    private func existingRoute(_ context: AuthenticatedContext) async throws -> JSON {
        let id = context.parameters.get("id") ?? ""
        guard let route = try await features.route(id) else { throw Self.noRoute(id) }
        return route
    }

    static func noRoute(_ id: String) -> GatewayError { .notFound("No route with id '\(id)'.") }

    /// `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`, as the `routes.id` check says.
    static func isRouteID(_ s: String) -> Bool {
        let scalars = Array(s.unicodeScalars)
        guard (1...64).contains(scalars.count) else { return false }
        return scalars.enumerated().allSatisfy { offset, c in
            c.isASCII && (("a"..."z").contains(c) || ("A"..."Z").contains(c) || ("0"..."9").contains(c))
                || (offset > 0 && (c == "_" || c == "." || c == "-"))
        }
    }

    /// A route body; for an update, missing fields keep their current values. A create without
    /// `id` gets a generated one.
    func routeInput(_ f: BodyFields, id: String?, existing: JSON?) throws -> FeatureStore.RouteInput {
        let routeID = try f.resourceID(
            path: id, what: "route", isValid: Self.isRouteID,
            rule: "1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit",
            generated: { "route-" + UUID().uuidString.lowercased() })
        let method = try f.string("method", maxLength: 16) ?? existing?["method"]?.stringValue ?? "*"
        guard method == "*" || method.unicodeScalars.allSatisfy({ ("A"..."Z").contains($0) || ("a"..."z").contains($0) }) else {
            throw GatewayError.invalidRequest("'method' must be '*' or an HTTP method such as POST.")
        }
        guard let path = try f.string("path", maxLength: 500) ?? existing?["path"]?.stringValue else {
            throw GatewayError.invalidRequest("'path' is required (an exact path, or a prefix ending in '*', such as /v1/models*).")
        }
        let units = try f.int("units", range: 0...1_000_000) ?? existing?["units"]?.intValue ?? 1
        var itemsField = existing?["items_field"]?.stringValue
        if f.has("items_field") { itemsField = try f.string("items_field", maxLength: 200) }
        var feature = existing?["feature"]?.stringValue
        if f.has("feature") { feature = try f.string("feature", maxLength: 64) }
        var headerFeatures = existing?["header_features"]?.arrayValue?.compactMap(\.stringValue)
        if f.has("header_features") { headerFeatures = try f.featureIDs("header_features", allowEmpty: false) }
        return FeatureStore.RouteInput(
            id: routeID, method: method.uppercased(), path: try Self.routePath(path, prefix: prefix), units: Int32(units),
            itemsField: itemsField, feature: feature,
            featureHeader: try f.bool("feature_header") ?? existing?["feature_header"]?.boolValue ?? false,
            headerFeatures: headerFeatures,
            allowed: try f.bool("allowed") ?? existing?["allowed"]?.boolValue ?? true)
    }

    /// A route's path as stored: lower-cased (calls are matched case-insensitively), a `*` only
    /// at the end, and a path a call could have: canonical as ``RouteTable/canonicalPath(_:)``
    /// reads a call's path (no `..`, `//`, `;`, `\`, needless escapes), no query or fragment, and
    /// under the forward prefix (a route elsewhere would never match).
    static func routePath(_ path: String, prefix: String) throws -> String {
        let isPrefix = path.hasSuffix("*")
        let body = isPrefix ? String(path.dropLast()) : path
        guard body.hasPrefix("/"), !body.contains("*"),
            !body.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value >= 0x7f || $0 == "?" || $0 == "#" })
        else {
            throw GatewayError.invalidRequest(
                "'path' must start with '/', hold no spaces, '?' or '#', and have '*' only at its end (a prefix such as /v1/models*).")
        }
        let lowered = body.lowercased()
        guard let canonical = RouteTable.canonicalPath(Substring(body)), canonical == lowered || canonical + "/" == lowered else {
            throw GatewayError.invalidRequest(
                "'path' must be written as calls send it: no '.' or '..' segments, no '//', ';' or '\\', no needless %-escapes.")
        }
        let prefixLowered = prefix.lowercased()
        guard lowered.hasPrefix(prefixLowered) || (isPrefix && prefixLowered.hasPrefix(lowered)) else {
            throw GatewayError.invalidRequest("'path' must be under the forward prefix \(prefix): no call to another path is forwarded.")
        }
        // A call's path is matched without its trailing '/', so an exact route is stored so too.
        return isPrefix ? lowered + "*" : canonical
    }
}
