import Foundation
import HTTPTypes
import Hummingbird
import NIOCore

/// What a call costs (SPEC §8): its route's units (times the items of `items_field`) and its
/// feature (the route's, or the one `CapGate-Feature` names where the route allows it).
struct CallCost: Sendable {
    var units: Int
    var feature: String?
    /// The feature came from the client's `CapGate-Feature` header.
    var featureFromHeader: Bool
    var rule: RouteRule?
}

extension HTTPField.Name {
    static let capgateFeature = HTTPField.Name("CapGate-Feature")!
}

extension ProxyHandler {
    /// The most units one call may cost (the admission's integer).
    static let maxUnits = Int(Int32.max)

    /// Matches the call against the route table. Throws the 400 of a path that cannot be matched
    /// safely, a bad `items_field` body or `CapGate-Feature` (also one the route's
    /// `header_features` do not list), and the 403 of a route that is not allowed. With no routes
    /// at all every call costs 1 unit and names no feature (SPEC §2).
    static func cost(method: String, path: String, headers: HTTPFields, body: CallBody, table: RouteTable.Snapshot) throws -> CallCost {
        guard !table.rules.isEmpty else { return CallCost(units: 1, feature: nil, featureFromHeader: false, rule: nil) }
        guard let canonical = RouteTable.canonicalPath(Substring(path)) else {
            throw GatewayError.invalidRequest(
                "The request path has dot segments, empty segments, a backslash, a semicolon or escaped characters that need no escaping; send the plain path."
            )
        }
        guard let rule = table.match(method: method, path: canonical) else {
            return CallCost(units: 1, feature: nil, featureFromHeader: false, rule: nil)
        }
        guard rule.allowed else {
            throw GatewayError.permission("This route is not allowed through the gateway.")
        }
        var units = rule.units
        if let field = rule.itemsField {
            let items = try body.items(field, units: rule.units)
            let (total, overflow) = units.multipliedReportingOverflow(by: items)
            guard !overflow, total <= maxUnits else {
                throw GatewayError.invalidRequest("This call would cost more units than one call can.")
            }
            units = total
        }
        if rule.featureHeader, let named = headers[.capgateFeature] {
            let name = named.trimmingCharacters(in: .whitespaces)
            guard isFeatureID(name) else {
                throw GatewayError.invalidRequest(
                    "CapGate-Feature must name a feature id (lower-case letters, digits, '_', '.', '-'; at most 64 characters).")
            }
            if let listed = rule.headerFeatures, !listed.contains(name) {
                let offered = listed.isEmpty ? "no feature" : listed.joined(separator: ", ")
                throw GatewayError.invalidRequest(
                    "CapGate-Feature names \"\(name)\", which this route does not offer; it may name \(offered).")
            }
            return CallCost(units: units, feature: name, featureFromHeader: true, rule: rule)
        }
        return CallCost(units: units, feature: rule.feature, featureFromHeader: false, rule: rule)
    }

    /// The path of a request target as it was sent, without its query.
    static func rawPath(_ target: String?) -> String? {
        guard let target else { return nil }
        return String(target.prefix { $0 != "?" && $0 != "#" })
    }

    /// A feature id as `features.id` allows it.
    static func isFeatureID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        return bytes.enumerated().allSatisfy { index, b in
            let alnum = (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b)
            return alnum || (index > 0 && (b == UInt8(ascii: "_") || b == UInt8(ascii: ".") || b == UInt8(ascii: "-")))
        }
    }

    /// The 400 or 402 of a call refused for its feature.
    static func featureRefusal(_ admission: Admission, cost: CallCost) -> GatewayError {
        let state = admission.state
        let feature = state.feature
        let name = feature?.name ?? cost.feature ?? "this feature"
        switch admission.decision {
        case .unknownFeature where cost.featureFromHeader:
            return GatewayError.invalidRequest(
                "CapGate-Feature names \"\(cost.feature ?? "")\", which is not a feature of this gateway or is not active.")
        case .featureLimitExceeded:
            let refused = feature?.refused
            var headers = state.rateLimitHeaders()
            let reset = refused.flatMap { feature?.resetAt($0, periodEnd: state.periodEnd) } ?? state.periodEnd
            headers[.retryAfter] = reset.map { String(max(1, Int($0.timeIntervalSinceNow.rounded(.up)))) } ?? "3600"
            let scope = refused?.scope.rawValue ?? "company"
            let message =
                feature?.message
                ?? {
                    let whose = refused?.scope == .user ? "You have" : "Your company has"
                    let window = refused?.window == .day ? "today" : "in this period"
                    let limit = refused?.limit.map(String.init) ?? "all"
                    let when = reset.map { " It renews at \(Timestamp.format($0))." } ?? ""
                    let upgrade = state.upgrade.map { " Upgrading to the \($0.plan) plan raises the limit." } ?? ""
                    return "\(whose) used all \(limit) \(name) allowed \(window).\(when)\(upgrade)"
                }()
            return GatewayError(
                .init(code: 402), "feature_limit_exceeded", message, usage: state.json(scope: scope, featureRefusal: true),
                headers: headers)
        default:
            // Not in the plan, disabled there, or (named by the route itself) no longer active.
            var headers = HTTPFields()
            headers[.retryAfter] = ProxyHandler.retryAfter(state)
            let upgrade = state.upgrade.map { " The \($0.plan) plan includes it." } ?? ""
            let message = feature?.message ?? "\(name) is not included in your company's \(state.plan?.name ?? "current") plan.\(upgrade)"
            return GatewayError(
                .init(code: 402), "feature_not_in_plan", message, usage: state.json(scope: "company", featureRefusal: true),
                headers: headers)
        }
    }
}
