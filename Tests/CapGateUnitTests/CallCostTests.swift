import HTTPTypes
import NIOCore
import Testing

@testable import CapGate

/// Route matching and cost (SPEC §8) on a route table held in memory.
@Suite("Route matching and cost")
struct CallCostTests {
    static func rule(
        _ id: String, _ method: String = "*", _ path: String, units: Int = 1, items: String? = nil, feature: String? = nil,
        header: Bool = false, headerFeatures: [String]? = nil, allowed: Bool = true
    ) -> RouteRule {
        let prefix = path.hasSuffix("*")
        return RouteRule(
            id: id, method: method, path: prefix ? String(path.dropLast()) : path, prefix: prefix, units: units, itemsField: items,
            feature: feature, featureHeader: header, headerFeatures: headerFeatures, allowed: allowed)
    }

    static let table = RouteTable.Snapshot(
        version: 7,
        rules: [
            rule("batch", "POST", "/v1/messages/batches", units: 2, items: "requests", feature: "batch"),
            rule("messages", "POST", "/v1/messages", units: 3, feature: "analysis", header: true, headerFeatures: ["analysis", "vision"]),
            rule("count", "POST", "/v1/messages/count_tokens", units: 0),
            rule("files", "*", "/v1/files*", allowed: false),
            rule("models", "GET", "/v1/models*", units: 0),
        ].sorted(by: RouteRule.moreSpecific))

    static func cost(
        _ method: String, _ path: String, body: String = "", type: String? = "application/json", headers: HTTPFields = [:],
        table: RouteTable.Snapshot = table
    ) throws -> CallCost {
        let reading = try CallBody.read(ByteBuffer(string: body), contentType: type, maxDepth: 128)
        return try CallCost.of(method: method, path: path, headers: headers, body: reading, table: table)
    }

    @Test("no routes at all: every call is 1 unit and names no feature")
    func empty() throws {
        let cost = try Self.cost("POST", "/v1/anything", table: .init(version: 0, rules: []))
        #expect(cost.units == 1 && cost.feature == nil)
    }

    @Test("exact before prefix, a method before *; an unmatched call costs 1 unit")
    func matching() throws {
        #expect(try Self.cost("POST", "/v1/messages").units == 3)
        #expect(try Self.cost("POST", "/v1/messages/count_tokens").units == 0)
        #expect(try Self.cost("GET", "/v1/models/claude").units == 0)
        #expect(try Self.cost("POST", "/v1/models/claude").units == 1)
        #expect(try Self.cost("GET", "/v1/messages").feature == nil)
    }

    @Test("items_field: units times the elements of the top-level array, read as I-JSON whatever the content type")
    func items() throws {
        let body = #"{"requests":[{},{},{}],"model":"m"}"#
        #expect(try Self.cost("POST", "/v1/messages/batches", body: body).units == 6)
        #expect(try Self.cost("POST", "/v1/messages/batches", body: body, type: "text/plain").units == 6)
        for bad in [#"{"requests":[]}"#, #"{"requests":{}}"#, #"{"requests":[1],"requests":[1,2]}"#, "not json"] {
            #expect(throws: GatewayError.self, "\(bad)") { try Self.cost("POST", "/v1/messages/batches", body: bad, type: "text/plain") }
        }
    }

    @Test("a route not allowed is 403; a path with dot segments or needless escapes is 400")
    func refusals() {
        #expect(throws: GatewayError.self) { try Self.cost("GET", "/v1/files/abc") }
        for path in ["/v1/x/../messages", "/v1//messages", "/v1/%6Dessages", "/v1/messages;x"] {
            do {
                _ = try Self.cost("POST", path)
                Issue.record("\(path) was matched")
            } catch let error as GatewayError {
                #expect(error.status == .badRequest, "\(path)")
            } catch {
                Issue.record("\(error)")
            }
        }
    }

    @Test("CapGate-Feature: only where the route allows it, only a feature id, only one the route lists")
    func headerFeature() throws {
        var headers = HTTPFields()
        headers[.capgateFeature] = "vision"
        let picked = try Self.cost("POST", "/v1/messages", headers: headers)
        #expect(picked.feature == "vision" && picked.featureFromHeader)
        headers[.capgateFeature] = "batch"
        #expect(throws: GatewayError.self) { try Self.cost("POST", "/v1/messages", headers: headers) }
        headers[.capgateFeature] = "Not An Id"
        #expect(throws: GatewayError.self) { try Self.cost("POST", "/v1/messages", headers: headers) }
        // A route without feature_header ignores the header: its own feature pays.
        headers[.capgateFeature] = "analysis"
        #expect(try Self.cost("POST", "/v1/messages/batches", body: #"{"requests":[1]}"#, headers: headers).feature == "batch")
    }

    @Test("feature ids: lower-case letters and digits first, then '_', '.', '-'; 1 to 64 bytes")
    func featureIDs() {
        for good in ["a", "analysis", "v2.vision-hd_x", String(repeating: "a", count: 64)] {
            #expect(CallCost.isFeatureID(good), "\(good)")
        }
        for bad in ["", "_a", "A", "a b", "é", String(repeating: "a", count: 65)] { #expect(!CallCost.isFeatureID(bad), "\(bad)") }
    }
}
