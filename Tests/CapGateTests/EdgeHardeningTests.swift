import AsyncHTTPClient
import Foundation
import JWTKit
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing

@testable import CapGate

/// Issue #17 "No way around a cap": dot segments and encoded separators in forwarded paths,
/// bounded metric labels, JWT audience/issuer/leeway, and CSV formula neutralisation.
@Suite("Edge hardening", .timeLimit(.minutes(5)))
struct EdgeHardeningTests {
    // MARK: dot segments

    @Test("dot segments (also %2e forms) are resolved; leaving the prefix, climbing above the root or '..;' is 400")
    func forwardTargetResolution() throws {
        func resolved(_ path: String, query: String? = nil) throws -> String {
            try ForwardTarget(path: path, query: query, prefix: "/v1/").target
        }
        #expect(try resolved("/v1/messages") == "/v1/messages")
        #expect(try resolved("/v1/messages", query: "beta=true") == "/v1/messages?beta=true")
        #expect(try resolved("/v1/a/../b", query: "x=1") == "/v1/b?x=1")
        #expect(try resolved("/v1/./messages") == "/v1/messages")
        #expect(try resolved("/v1/a/%2e%2e/b") == "/v1/b")
        #expect(try resolved("/v1/a/%2E%2E/b") == "/v1/b")
        #expect(try resolved("/v1/a/.%2e/b") == "/v1/b")
        #expect(try resolved("/v1/a/%2e./b") == "/v1/b")
        #expect(try resolved("/v1/a/%2e/b") == "/v1/a/b")
        #expect(try resolved("/v1/a/b/..") == "/v1/a/")
        #expect(try resolved("/v1/a/.") == "/v1/a/")
        #expect(try resolved("/v1/a/..%2e/b") == "/v1/a/..%2e/b")  // three dots: an ordinary segment
        #expect(try resolved("/v1/a.b/c..d") == "/v1/a.b/c..d")
        #expect(try resolved("/x/../v1/messages") == "/v1/messages")
        #expect(try ForwardTarget(path: "/v1/a/../b", query: nil, prefix: "/v1/").changed)
        #expect(try ForwardTarget(path: "/v1/b", query: nil, prefix: "/v1/").changed == false)

        for bad in [
            "/v1/../admin/v1/companies", "/v1/%2e%2e/admin/v1/plans", "/v1/.%2E/healthz", "/v1/..", "/v1/a/../../b",
            "/v1/../../etc/passwd", "/..", "/v1/a/..;x/b", "/v1/a/.;/b",
        ] {
            #expect(throws: GatewayError.self, "\(bad) should be refused") { try resolved(bad) }
        }
        for bad in ["/v1/a%2fb", "/v1/a%2Fb", "/v1/a%5cb", "/v1/a%5Cb", "/v1/a\\b", "/v1/a#b"] {
            let target = try ForwardTarget(path: bad, query: nil, prefix: "/v1/")
            #expect(throws: GatewayError.self, "\(bad) should not be forwarded") { try target.checkForwardable() }
        }
        #expect(throws: Never.self) { try ForwardTarget(path: "/v1/messages", query: nil, prefix: "/v1/").checkForwardable() }
    }

    @Test("through the gateway: the resolved path is forwarded, own routes stay own, bad paths are 400 and never forwarded")
    func dotSegmentsEndToEnd() async throws {
        try await Harness.with { h in
            try await h.createPlan("wide", company: 1_000, user: 1_000)
            let (_, users) = try await h.createCompany(plan: "wide", users: 1)
            let key = users[0].key
            let port = try #require(URLComponents(string: h.gatewayURL)?.port)

            for (target, expected) in [
                ("/v1/echo/a/../b?x=1", "/v1/echo/b"), ("/v1/echo/%2e%2e/c", "/v1/c"), ("/v1/echo/.%2E/./d", "/v1/d"),
                ("/zzz/../v1/echo/e", "/v1/echo/e"), ("/v1/echo/%2E/f/", "/v1/echo/f/"),
            ] {
                let reply = try await RawHTTP.send(port: port, method: "GET", target: target, headers: [("x-api-key", key)])
                #expect(reply.status == 200, "\(target): \(reply.body)")
                let json = try JSON.parse(Array(reply.body.utf8))
                #expect(json["path"]?.stringValue == expected, "\(target) reached the provider as \(reply.body)")
            }
            // A metered call with a body: forwarded, charged and recorded under the resolved path.
            let message = try await RawHTTP.send(
                port: port, method: "POST", target: "/v1/x/%2e%2e/messages",
                headers: [("x-api-key", key), ("anthropic-version", "2023-06-01")],
                body: #"{"model":"claude-test","max_tokens":8,"messages":[{"role":"user","content":"Hi"}]}"#)
            #expect(message.status == 200, "\(message.body)")
            #expect(try JSON.parse(Array(message.body.utf8))["type"]?.stringValue == "message")
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE route = '/v1/messages' AND model = 'claude-test'") == 1)
            let echoed = try await RawHTTP.send(port: port, method: "GET", target: "/v1/echo/a/../b?x=1", headers: [("x-api-key", key)])
            #expect(try JSON.parse(Array(echoed.body.utf8))["query"]?.stringValue == "x=1")

            let forwarded = h.mock.counter.count
            for target in [
                "/v1/../admin/v1/companies", "/v1/%2e%2e/admin/v1/plans", "/v1/.%2e/admin/v1/plans", "/v1/..", "/v1/../../etc/passwd",
                "/v1/echo/a%2fb", "/v1/echo/a%2F..%2Fb", "/v1/echo/a%5cb", "/v1/echo/..;x/admin", "/v1/%2e%2e/healthz",
            ] {
                // SPEC §2's order: 401 before 400, so without a valid credential the path's 400 is a 401.
                let cases: [([(String, String)], Int, String)] = [
                    ([("x-api-key", key)], 400, "invalid_request_error"), (h.asOperator, 400, "invalid_request_error"),
                    ([], 401, "authentication_error"), ([("x-api-key", "cg_not_a_key")], 401, "authentication_error"),
                ]
                for (headers, status, type) in cases {
                    let reply = try await RawHTTP.send(port: port, method: "GET", target: target, headers: headers)
                    #expect(reply.status == status, "\(target): \(reply.status) \(reply.body)")
                    let json = try JSON.parse(Array(reply.body.utf8))
                    #expect(json["type"]?.stringValue == "error")
                    #expect(json["error"]?["type"]?.stringValue == type, "\(target): \(reply.body)")
                }
            }
            // A raw backslash: refused, by the HTTP parser or by CapGate.
            let backslash = try await RawHTTP.send(port: port, method: "GET", target: "/v1/echo/a\\b", headers: [("x-api-key", key)])
            #expect(backslash.status == 400 || backslash.status == 0, "\(backslash.status) \(backslash.body)")
            #expect(h.mock.counter.count == forwarded, "a refused path reached the provider")

            // Paths that resolve onto CapGate's own routes are never forwarded; the router matched
            // the path as sent, so CapGate asks for the path without dot segments.
            for target in ["/v1/./usage", "/v1/usage/../usage", "/v1/%2E/usage", "/v1/x/../usage", "/admin/v1/../v1/plans"] {
                let reply = try await RawHTTP.send(port: port, method: "GET", target: target, headers: [("x-api-key", key)])
                #expect(reply.status == 400, "\(target): \(reply.body)")
                #expect(try JSON.parse(Array(reply.body.utf8))["error"]?["type"]?.stringValue == "invalid_request_error")
            }
            #expect(try await RawHTTP.send(port: port, method: "GET", target: "/v1/usage", headers: [("x-api-key", key)]).status == 200)
            #expect(h.mock.counter.count == forwarded, "an own route was forwarded")
            #expect(
                try await h.scalar("SELECT count(*) FROM usage_ledger WHERE route LIKE '%..%' OR route LIKE '%\\%2e%' ESCAPE '\\'") == 0)
        }
    }

    // MARK: metric labels

    @Test("route labels come from the route table: own route patterns, known provider routes, 'proxied', 'unmatched'")
    func routeLabels() {
        #expect(ProviderRoutes.label(for: "/v1/messages") == "/v1/messages")
        #expect(ProviderRoutes.label(for: "/v1/messages/") == "/v1/messages")
        #expect(ProviderRoutes.label(for: "/v1/messages/count_tokens") == "/v1/messages/count_tokens")
        #expect(ProviderRoutes.label(for: "/v1/messages/batches/msgbatch_0123456789") == "/v1/messages/batches/{id}")
        #expect(ProviderRoutes.label(for: "/v1/models/claude-x") == "/v1/models/{id}")
        #expect(ProviderRoutes.label(for: "/v1/\(UUID().uuidString)") == "proxied")
        #expect(ProviderRoutes.label(for: "/v1/messages/a/b/c/d/e") == "proxied")
        #expect(GatewayEdge.routeLabel(path: "/zzz/abc", proxied: false, endpoint: nil) == "unmatched")
        #expect(GatewayEdge.routeLabel(path: "/zzz/abc", proxied: false, endpoint: "NotFound") == "unmatched")
        #expect(
            GatewayEdge.routeLabel(path: "/admin/v1/companies/x/usage", proxied: false, endpoint: "/admin/v1/companies/{id}/usage")
                == "/admin/v1/companies/{id}/usage")
    }

    @Test("500 random unknown paths (under /v1/ and outside it) add at most a few metric series")
    func boundedSeries() async throws {
        try await Harness.with { h in
            try await h.createPlan("unlimited", company: nil, user: nil)
            let (company, users) = try await h.createCompany(plan: "unlimited", users: 1, role: "admin")
            let key = users[0].key
            // Warm up the label set this test's own calls use.
            #expect(try await h.request(.GET, "/v1/warm-\(UUID().uuidString)", headers: [("x-api-key", key)]).status == 200)
            #expect(try await h.request(.GET, "/zzz/warm").status == 404)
            #expect(try await h.request(.GET, "/v1/warm", headers: [("x-api-key", "cg_wrong")]).status == 401)
            let before = try await Self.series(h)

            let randoms = (0..<500).map { _ in UUID().uuidString.lowercased() }
            try await withThrowingTaskGroup(of: Int.self) { group in
                for (i, random) in randoms.enumerated() {
                    group.addTask {
                        switch i % 3 {
                        case 0: return try await h.request(.GET, "/v1/\(random)/\(i)?q=\(random)", headers: [("x-api-key", key)]).status
                        case 1: return try await h.request(.POST, "/zzz/\(random)/\(i)").status
                        default: return try await h.request(.GET, "/v1/\(random)", headers: [("x-api-key", "cg_wrong")]).status
                        }
                    }
                    if i >= 32 { _ = try await group.next() }
                }
                for try await _ in group {}
            }
            // Own routes are labelled by their pattern, not their path.
            #expect(try await h.request(.GET, "/admin/v1/companies/\(company.text)/usage", headers: [("x-api-key", key)]).status == 200)

            let after = try await Self.series(h)
            // Other suites running meanwhile add their own series (bounded too), so the growth is
            // only a loose check; the shape of every label below is the exact one.
            #expect(after.requests - before.requests <= 200, "capgate_requests_total grew by \(after.requests - before.requests) series")
            let text = try await h.request(.GET, "/metrics", headers: h.asOperator).body
            // Every route label in the whole registry (every gateway of this test process) is a
            // route pattern or a fixed name: no segment is an id, a number or anything a caller chose.
            let labels = Set(
                text.split(separator: "\n").compactMap { line -> Substring? in
                    guard let start = line.range(of: #"route=""#)?.upperBound else { return nil }
                    return line[start...].prefix { $0 != "\"" }
                })
            let fixed: Set<Substring> = ["proxied", "unmatched"]
            for label in labels where !fixed.contains(label) {
                let segments = label.split(separator: "/")
                let patterned =
                    label.hasPrefix("/")
                    && segments.allSatisfy { segment in
                        (segment.hasPrefix("{") && segment.hasSuffix("}"))
                            || (segment.allSatisfy { $0.isLetter || $0.isNumber || "_-.".contains($0) }
                                && segment.filter(\.isNumber).count <= 2 && segment.count <= 24)
                    }
                #expect(patterned, "route label \(label) is not a route pattern")
            }
            #expect(text.contains(#"route="proxied""#))
            #expect(text.contains(#"route="unmatched""#))
            #expect(text.contains(#"route="/admin/v1/companies/{id}/usage""#))
            #expect(!text.contains(#"route="/zzz"#))
            #expect(!text.contains(company.text))
            for random in randoms { #expect(!text.contains(random), "a raw path reached /metrics") }
        }
    }

    static func series(_ h: Harness) async throws -> (all: Int, requests: Int) {
        let lines = try await h.request(.GET, "/metrics", headers: h.asOperator).body.split(separator: "\n").filter { !$0.hasPrefix("#") }
        return (lines.count, lines.filter { $0.hasPrefix("capgate_requests_total{") }.count)
    }

    // MARK: CSV

    @Test("a CSV cell starting with =, +, -, @, TAB or CR gets a ' in front, inside quotes")
    func csvCells() {
        typealias Event = UsageStore.Event
        #expect(Event.csvField("=HYPERLINK(\"http://x\",\"y\")") == #""'=HYPERLINK(""http://x"",""y"")""#)
        #expect(Event.csvField("@SUM(A1)") == #""'@SUM(A1)""#)
        #expect(Event.csvField("+1") == #""'+1""#)
        #expect(Event.csvField("-1+2") == #""'-1+2""#)
        #expect(Event.csvField("\t=1") == "\"'\t=1\"")
        #expect(Event.csvField("\r\n=1") == "\"'\r\n=1\"")
        #expect(Event.csvField("a\r\nb") == "\"a\r\nb\"")
        #expect(Event.csvField("/v1/messages") == "/v1/messages")
        #expect(Event.csvField("a,b") == #""a,b""#)
        #expect(Event.csvField("42") == "42")
        #expect(Event.csvField("") == "")
    }

    @Test("the events CSV neutralises formulas in client-controlled model and idempotency key")
    func csvExport() async throws {
        try await Harness.with { h in
            try await h.createPlan("low", company: 100, user: 100)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let models = ["=HYPERLINK(\"http://evil.example\",\"click\")", "@SUM(1+1)", "+1+2", "-3-4", "\t=1", "\r=1"]
            for (i, model) in models.enumerated() {
                let reply = try await h.message(key: users[0].key, model: model, headers: [("idempotency-key", "=cmd|' /C calc'!A\(i)")])
                #expect(reply.status == 200, "\(reply.body)")
            }
            let csv = try await h.request(
                .GET, "/admin/v1/companies/\(company.text)/events", headers: h.asOperator + [("accept", "text/csv")])
            #expect(csv.status == 200)
            #expect(csv.headers.first(name: "content-type")?.hasPrefix("text/csv") == true)
            #expect(csv.body.contains(#""'=HYPERLINK(""http://evil.example"",""click"")""#))
            let rows = Self.parseCSV(csv.body)
            #expect(rows.count == models.count + 1, "\(rows.count) rows")
            let header = rows.first ?? []
            let modelColumn = try #require(header.firstIndex(of: "model"))
            let keyColumn = try #require(header.firstIndex(of: "idempotency_key"))
            #expect(Set(rows.dropFirst().map { $0[modelColumn] }) == Set(models.map { "'" + $0 }))
            #expect(rows.dropFirst().allSatisfy { $0[keyColumn].hasPrefix("'=cmd") })
            for row in rows.dropFirst() {
                for cell in row {
                    if let first = cell.unicodeScalars.first {
                        #expect(!"=+-@\t\r".unicodeScalars.contains(first), "cell \(cell.debugDescription) is live")
                    }
                }
            }
        }
    }

    /// RFC 4180 fields, quotes undone.
    static func parseCSV(_ text: String) -> [[String]] {
        var rows: [[String]] = []
        var row: [String] = []
        var field = ""
        var quoted = false
        var scalars = Array(text.unicodeScalars)[...]
        while let c = scalars.popFirst() {
            if quoted {
                if c == "\"" {
                    if scalars.first == "\"" {
                        field.unicodeScalars.append("\"")
                        scalars.removeFirst()
                    } else {
                        quoted = false
                    }
                } else {
                    field.unicodeScalars.append(c)
                }
            } else if c == "\"" {
                quoted = true
            } else if c == "," {
                row.append(field)
                field = ""
            } else if c == "\n" {
                row.append(field)
                rows.append(row)
                row = []
                field = ""
            } else {
                field.unicodeScalars.append(c)
            }
        }
        if !field.isEmpty || !row.isEmpty { rows.append(row + [field]) }
        return rows
    }

    // MARK: JWT

    @Test("JWT claim rules: exp required, exp and nbf with leeway, aud (string or array) and iss when configured")
    func claimRules() throws {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let t = Int64(now.timeIntervalSince1970)
        let rules = JWTClaimRules(audience: "capgate", issuer: "https://id.example", leeway: 60)
        func claims(_ fields: [JSON.Field]) -> JSON { .object([.init("exp", .int(t + 600)), .init("iss", "https://id.example")] + fields) }
        func message(_ claims: JSON, _ rules: JWTClaimRules = rules) -> String? {
            do {
                try rules.check(claims, now: now)
                return nil
            } catch {
                return error.body["error"]?["message"]?.stringValue ?? "refused"
            }
        }
        #expect(message(claims([.init("aud", "capgate")])) == nil)
        #expect(message(claims([.init("aud", .array(["other", "capgate"]))])) == nil)
        #expect(message(claims([.init("aud", "other")]))?.contains("audience (aud)") == true)
        #expect(message(claims([.init("aud", .array(["other"]))]))?.contains("audience (aud)") == true)
        #expect(message(claims([]))?.contains("audience (aud)") == true)
        #expect(
            message(.obj(["exp": .int(t + 600), "iss": "https://evil.example", "aud": "capgate"]))?.contains("issuer (iss)") == true)
        #expect(message(.obj(["exp": .int(t + 600), "aud": "capgate"]))?.contains("issuer (iss)") == true)

        let open = JWTClaimRules(leeway: 60)
        #expect(message(.obj(["sub": "x"]), open)?.contains("no exp") == true)
        #expect(message(.obj(["exp": .int(t - 30)]), open) == nil)
        #expect(message(.obj(["exp": .int(t - 60)]), open)?.contains("expired") == true)
        #expect(message(.obj(["exp": .int(t - 30)]), JWTClaimRules(leeway: 0))?.contains("expired") == true)
        #expect(message(.obj(["exp": .int(t + 600), "nbf": .int(t + 30)]), open) == nil)
        #expect(message(.obj(["exp": .int(t + 600), "nbf": .int(t + 90)]), open)?.contains("not valid yet") == true)
        #expect(message(.obj(["exp": .int(t + 600), "nbf": .int(t + 30)]), JWTClaimRules(leeway: 0))?.contains("not valid yet") == true)
        #expect(message(.obj(["exp": .int(t + 600), "aud": "anything"]), open) == nil)
    }

    @Test("jwt.audience, jwt.issuer and jwt.leeway come from the environment (JWT_AUDIENCE, JWT_ISSUER, JWT_LEEWAY)")
    func jwtConfiguration() async throws {
        let defaults = try await CapGateConfiguration.load(environment: [:], file: "/nonexistent/capgate.json")
        #expect(defaults.jwt.audience == nil && defaults.jwt.issuer == nil && defaults.jwt.leeway == 0)
        let set = try await CapGateConfiguration.load(
            environment: ["JWT_AUDIENCE": "capgate", "JWT_ISSUER": "https://id.example", "JWT_LEEWAY": "5"],
            file: "/nonexistent/capgate.json")
        #expect(set.jwt.audience == "capgate" && set.jwt.issuer == "https://id.example" && set.jwt.leeway == 5)
        for key in ["jwt.audience", "jwt.issuer", "jwt.leeway"] { #expect(CapGateConfiguration.keys.contains(key)) }
        await #expect(throws: ConfigurationError.self) {
            _ = try await CapGateConfiguration.load(environment: ["JWT_LEEWAY": "-1"], file: "/nonexistent/capgate.json")
        }
    }

    @Test("through the gateway: a token for another audience or issuer is 401; small clock skew is allowed")
    func jwtAudienceIssuer() async throws {
        let settings = [
            "jwt.secret": JWTTests.secret, "jwt.audience": "capgate-test", "jwt.issuer": "https://id.example", "jwt.leeway": "60",
        ]
        try await Harness.with(settings: settings) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let now = Int(Date().timeIntervalSince1970)
            func token(
                aud: EdgeClaims.Audience? = .one("capgate-test"), iss: String? = "https://id.example", exp: Int? = nil, nbf: Int? = nil
            ) async throws -> String {
                let keys = JWTKeyCollection()
                await keys.add(hmac: HMACKey(from: JWTTests.secret), digestAlgorithm: .sha256)
                return try await keys.sign(
                    EdgeClaims(sub: users[0].id.text, exp: exp ?? now + 3600, nbf: nbf, company_id: company.text, iss: iss, aud: aud))
            }
            func usage(_ token: String) async throws -> Harness.Reply {
                try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(token)")])
            }
            #expect(try await usage(try await token()).status == 200)
            #expect(try await usage(try await token(aud: .many(["other", "capgate-test"]))).status == 200)
            #expect(try await usage(try await token(exp: now - 20)).status == 200)  // within the configured 60 s leeway
            #expect(try await usage(try await token(nbf: now + 20)).status == 200)
            for (bad, words) in [
                (try await token(aud: .one("other")), "audience"), (try await token(aud: .many(["a", "b"])), "audience"),
                (try await token(aud: nil), "audience"), (try await token(iss: "https://evil.example"), "issuer"),
                (try await token(iss: nil), "issuer"), (try await token(exp: now - 300), "expired"),
                (try await token(nbf: now + 300), "not valid yet"),
            ] {
                let reply = try await usage(bad)
                #expect(reply.status == 401, "\(reply.body)")
                #expect(reply.json["error"]?["type"]?.stringValue == "authentication_error")
                #expect(reply.json["error"]?["message"]?.stringValue?.contains(words) == true, "\(reply.body)")
            }
            let call = try await h.request(
                .POST, "/v1/messages", headers: [("authorization", "Bearer \(try await token(aud: .one("other")))")],
                json: .obj(["model": "m", "max_tokens": 5]))
            #expect(call.status == 401)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'") == 0)
        }
    }
}

/// Claims with `aud` as a string or an array, `iss` and `nbf`.
struct EdgeClaims: JWTPayload {
    enum Audience: Codable {
        case one(String)
        case many([String])

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let one = try? container.decode(String.self) { self = .one(one) } else { self = .many(try container.decode([String].self)) }
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .one(let one): try container.encode(one)
            case .many(let many): try container.encode(many)
            }
        }
    }

    var sub: String
    var exp: Int
    var nbf: Int?
    var company_id: String
    var iss: String?
    var aud: Audience?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// One HTTP/1.1 exchange over a plain socket, with the request target sent byte for byte (an
/// HTTP client library may resolve or re-encode dot segments itself).
enum RawHTTP {
    struct Reply {
        var status: Int
        var body: String
    }

    static func send(port: Int, method: String, target: String, headers: [(String, String)], body: String? = nil) async throws -> Reply {
        var head = "\(method) \(target) HTTP/1.1\r\nhost: 127.0.0.1:\(port)\r\nconnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body {
            head += "content-type: application/json\r\ncontent-length: \(body.utf8.count)\r\n\r\n" + body
        } else {
            head += "\r\n"
        }
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port) {
            channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
        let text = try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: head))
            var text = ""
            for try await chunk in inbound { text += String(buffer: chunk) }
            return text
        }
        guard let split = text.range(of: "\r\n\r\n") else { return Reply(status: 0, body: text) }
        let headText = text[..<split.lowerBound]
        let status = headText.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        var body = String(text[split.upperBound...])
        if headText.lowercased().contains("transfer-encoding: chunked") { body = dechunk(body) }
        return Reply(status: status, body: body)
    }

    static func dechunk(_ text: String) -> String {
        var rest = Substring(text)
        var out = ""
        while let line = rest.range(of: "\r\n"), let size = Int(rest[..<line.lowerBound], radix: 16), size > 0 {
            let start = line.upperBound
            let utf8 = rest.utf8
            let end = utf8.index(start, offsetBy: size)
            out += String(rest[start..<end])
            rest = rest[end...].dropFirst(2)
        }
        return out
    }
}
