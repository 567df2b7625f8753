import HTTPTypes
import Testing

@testable import CapGate

/// The request target CapGate judges and forwards (Proxy/ForwardTarget.swift) and the path
/// routes are matched on (``RouteTable/canonicalPath(_:)``): dot segments resolved as RFC 3986
/// §5.2.4 says, and every spelling another server could read differently refused.
@Suite("Request paths: dot segments, forwardable targets, canonical route paths")
struct RequestPathTests {
    static func resolved(_ path: String) -> String? { try? ForwardTarget.removeDotSegments(path) }

    @Test("dot segments: '.' dropped, '..' removes the segment before it, also spelled %2e/%2E, a trailing one keeps the slash")
    func dotSegments() {
        let cases: [(String, String)] = [
            ("/v1/./messages", "/v1/messages"), ("/v1/a/../messages", "/v1/messages"), ("/v1/%2e%2E/admin", "/admin"),
            ("/v1/.%2e/x", "/x"), ("/v1/%2E/x", "/v1/x"), ("/v1/..", "/"), ("/v1/.", "/v1/"), ("/a/b/c/../../d", "/a/d"),
            ("/v1/.../x", "/v1/.../x"), ("/v1/..a/x", "/v1/..a/x"), ("/v1/%2e%2e%2e/x", "/v1/%2e%2e%2e/x"), ("/v1//x", "/v1//x"),
            ("/v1/messages", "/v1/messages"), ("*", "*"), ("/", "/"),
        ]
        for (path, expected) in cases {
            #expect(Self.resolved(path) == expected, "\(path)")
        }
    }

    @Test("dot segments that climb above the root, or carry ';' parameters, are 400")
    func dotRefusals() {
        for path in ["/..", "/../v1/messages", "/v1/../../x", "/%2e%2e/x", "/v1/..;x/messages", "/v1/.;/x", "/v1/%2e%2e;a"] {
            let error = UnitTestSupport.refusal { _ = try ForwardTarget.removeDotSegments(path) }
            #expect(error?.status == .badRequest && error?.type == "invalid_request_error", "\(path)")
        }
        #expect(Self.resolved("/v1/a;b/x") == "/v1/a;b/x")
    }

    @Test("a path under the prefix that resolves outside it is 400; the query is kept as sent; the target joins them")
    func target() throws {
        let error = UnitTestSupport.refusal { _ = try ForwardTarget(path: "/v1/../admin/v1/companies", query: nil, prefix: "/v1/") }
        #expect(error?.message.contains("leaves /v1/") == true)
        let inside = try ForwardTarget(path: "/v1/a/../messages", query: "beta=true&x=%2e", prefix: "/v1/")
        #expect(inside.path == "/v1/messages" && inside.changed && inside.isUnder("/v1/"))
        #expect(inside.target == "/v1/messages?beta=true&x=%2e")
        let plain = try ForwardTarget(path: "/v1/messages", query: nil, prefix: "/v1/")
        #expect(!plain.changed && plain.target == "/v1/messages")
        let outside = try ForwardTarget(path: "/admin/x/../v1/plans", query: "", prefix: "/v1/")
        #expect(outside.path == "/admin/v1/plans" && !outside.isUnder("/v1/") && outside.target == "/admin/v1/plans?")
    }

    @Test("not forwarded: an encoded slash or backslash in any case, a raw backslash, a '#'; other escapes pass")
    func forwardable() throws {
        for path in ["/v1/a%2Fb", "/v1/a%2fb", "/v1/a%5Cb", "/v1/a%5cb", "/v1/a\\b", "/v1/a#b"] {
            let error = UnitTestSupport.refusal { try ForwardTarget(path: path, query: nil, prefix: "/v1/").checkForwardable() }
            #expect(error?.status == .badRequest, "\(path)")
        }
        try ForwardTarget(path: "/v1/files/a%20b%23c", query: "q=%2F", prefix: "/v1/").checkForwardable()
    }

    @Test("the route path: lower-cased, one trailing slash dropped; the root stays '/'")
    func canonical() {
        #expect(RouteTable.canonicalPath("/V1/Messages/") == "/v1/messages")
        #expect(RouteTable.canonicalPath("/v1/messages") == "/v1/messages")
        #expect(RouteTable.canonicalPath("/") == "/")
        #expect(RouteTable.canonicalPath("/v1/files/a%20b") == "/v1/files/a%20b")
        #expect(RouteTable.canonicalPath("/v1/x%C3%A9") == "/v1/x%c3%a9")
    }

    @Test("no route path for what another server could read differently: dot or empty segments, ';', '\\\\', needless or bad escapes")
    func canonicalRefusals() {
        for path in [
            "/v1//messages", "/v1/messages//", "/v1/./messages", "/v1/../messages", "/v1/messages;x", "/v1\\messages", "/v1/%2F",
            "/v1/%2f", "/v1/%5C", "/v1/%2E", "/v1/%6Dessages", "/v1/%41", "/v1/%30", "/v1/%2D", "/v1/%5F", "/v1/%7E", "/v1/%zz",
            "/v1/%2", "/v1/%",
        ] {
            #expect(RouteTable.canonicalPath(Substring(path)) == nil, "\(path)")
        }
    }

    @Test("route order: exact before prefix, the longer prefix first, a method before '*', then by id; the call's method in any case")
    func routeOrder() {
        func rule(_ id: String, _ method: String, _ path: String, prefix: Bool) -> RouteRule {
            RouteRule(
                id: id, method: method, path: path, prefix: prefix, units: 1, itemsField: nil, feature: nil, featureHeader: false,
                allowed: true)
        }
        let rules = [
            rule("b-any", "*", "/v1/models", prefix: true), rule("short", "*", "/v1/", prefix: true),
            rule("a-any", "*", "/v1/models", prefix: true), rule("get", "GET", "/v1/models", prefix: true),
            rule("exact", "*", "/v1/models/m1", prefix: false),
        ]
        let sorted = rules.sorted(by: RouteRule.moreSpecific)
        #expect(sorted.map(\.id) == ["exact", "get", "a-any", "b-any", "short"])
        let table = RouteTable.Snapshot(version: 1, rules: sorted)
        #expect(table.match(method: "get", path: "/v1/models/m1")?.id == "exact")
        #expect(table.match(method: "get", path: "/v1/models/m2")?.id == "get")
        #expect(table.match(method: "DELETE", path: "/v1/models/m2")?.id == "a-any")
        #expect(table.match(method: "POST", path: "/v1/modelsx")?.id == "a-any")
        #expect(table.match(method: "POST", path: "/v1/messages")?.id == "short")
        #expect(table.match(method: "POST", path: "/v2/messages") == nil)
    }
}
