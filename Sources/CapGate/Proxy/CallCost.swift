import Foundation
import HTTPTypes
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

extension CallCost {
    /// The most units one call may cost (the admission's integer).
    static let maxUnits = Int(Int32.max)

    /// Matches the call against the route table. Throws the 400 of a path that cannot be matched
    /// safely, a bad `items_field` body or `CapGate-Feature` (also one the route's
    /// `header_features` do not list), and the 403 of a route that is not allowed. With no routes
    /// at all every call costs 1 unit and names no feature (SPEC §2).
    static func of(_ call: Call, table: RouteTable.Snapshot) throws -> CallCost {
        try of(method: call.method.rawValue, path: call.rawPath, headers: call.headers, body: call.reading, table: table)
    }

    static func of(method: String, path: String, headers: HTTPFields, body: CallBody, table: RouteTable.Snapshot) throws -> CallCost {
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

    /// A feature id as `features.id` allows it.
    static func isFeatureID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard (1...64).contains(bytes.count) else { return false }
        return bytes.enumerated().allSatisfy { index, b in
            let alnum = (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(b) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b)
            return alnum || (index > 0 && (b == UInt8(ascii: "_") || b == UInt8(ascii: ".") || b == UInt8(ascii: "-")))
        }
    }
}
