import AsyncHTTPClient
import CapGate
import Crypto
import Foundation
import NIOCore
import Testing

@testable import CapGate

/// Issue #26 through the real gateway: what CapGate charges is what the provider reads. Every
/// refused trick changes nothing (no ledger row, nothing forwarded), and each test ends on
/// served == charged and `capgate verify` clean.
@Suite("No way around a cap: one reading of every call", .timeLimit(.minutes(5)))
struct ChargeHonestyTests {
    static let request = #"{"custom_id":"r","params":{"model":"claude-haiku","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}}"#

    static func requests(_ n: Int) -> String { "[" + Array(repeating: request, count: n).joined(separator: ",") + "]" }

    /// A gateway in front of the recording provider, the recommended route table (batches cost
    /// one unit per element of `requests`) and one user's key.
    static func withGateway(
        settings: [String: String] = [:], _ body: @Sendable (Harness, RecordingProvider, String) async throws -> Void
    ) async throws {
        try await UpstreamStrictnessTests.withGateway(settings: settings) { h, provider, key in
            try await h.exec(
                """
                INSERT INTO routes (id, method, path, units, items_field) VALUES
                    ('models', 'GET', '/v1/models*', 0, NULL),
                    ('batches', 'POST', '/v1/messages/batches', 1, 'requests')
                """)
            try await body(h, provider, key)
            // Served == charged: every forwarded metered call is one charged ledger row, by units.
            let forwarded = provider.requests.filter { !$0.line.hasPrefix("GET /v1/models") }
            let units = forwarded.reduce(Int64(0)) { total, request in
                guard request.line.hasPrefix("POST /v1/messages/batches") else { return total + 1 }
                let top = try? JSONParser.members([], in: ByteBuffer(string: request.body))
                return total + Int64(top?.arrayCounts["requests"] ?? 0)
            }
            #expect(try await h.scalar("SELECT coalesce(sum(units), 0) FROM usage_ledger WHERE outcome = 'charged'") == units)
            #expect(try await CapGateRunner.verify(url: h.databaseURL, logger: TestCluster.logger).isEmpty)
        }
    }

    static func post(
        _ h: Harness, _ path: String, key: String, body: String, headers: [(String, String)] = []
    ) async throws -> Harness.Reply {
        try await h.request(.POST, path, headers: [("x-api-key", key), ("content-type", "application/json")] + headers, body: body)
    }

    @Test("the batch that was charged 1 and served 100: refused 400, nothing charged or forwarded; the honest batch costs its size")
    func duplicateBatch() async throws {
        try await Self.withGateway { h, provider, key in
            let attacks = [
                #"{"requests":\#(Self.requests(1)),"\udc00":0,"requests":\#(Self.requests(100))}"#,
                #"{"requests":\#(Self.requests(1)),"requests":\#(Self.requests(100))}"#,
                #"{"requests":\#(Self.requests(1)),"r\u0065quests":\#(Self.requests(100))}"#,
                #"{"requests":\#(Self.requests(1)),"x":NaN,"requests":\#(Self.requests(100))}"#,
                #"{"requests":\#(Self.requests(1))}{"requests":\#(Self.requests(100))}"#,
                #"{"requests":\#(Self.requests(1)),"deep":\#(String(repeating: "[", count: 200) + String(repeating: "]", count: 200))}"#,
                #"{"requests":\#(Self.requests(1)),"n":1e400}"#,
            ]
            for attack in attacks {
                let reply = try await Self.post(h, "/v1/messages/batches", key: key, body: attack)
                #expect(reply.status == 400, "\(attack.prefix(80))")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
                #expect(reply.json["error"]?["message"]?.stringValue?.contains("I-JSON") == true)
            }
            #expect(provider.requests.isEmpty)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)

            // The same tricks on /v1/messages: a cheap model recorded while an expensive one runs.
            let model = #"{"model":"claude-haiku","max_tokens":8,"messages":[],"model":"claude-opus"}"#
            #expect(try await Self.post(h, "/v1/messages", key: key, body: model).status == 400)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)

            let honest = try await Self.post(h, "/v1/messages/batches", key: key, body: #"{"requests":\#(Self.requests(3))}"#)
            #expect(honest.status == 200)
            #expect(try await h.scalar("SELECT sum(units) FROM usage_ledger") == 3)
            // A route that counts items reads the body as I-JSON whatever content type it claims.
            for contentType in ["text/plain", "application/x-www-form-urlencoded"] {
                let typed = try await h.request(
                    .POST, "/v1/messages/batches", headers: [("x-api-key", key), ("content-type", contentType)],
                    body: #"{"requests":\#(Self.requests(1)),"requests":\#(Self.requests(50))}"#)
                #expect(typed.status == 400)
            }
            let untyped = try await h.request(
                .POST, "/v1/messages/batches", headers: [("x-api-key", key)], body: #"{"requests":\#(Self.requests(2))}"#)
            #expect(untyped.status == 200)
            #expect(try await h.scalar("SELECT sum(units) FROM usage_ledger") == 5)
            #expect(provider.requests.count == 2)
        }
    }

    @Test("TRACE and CONNECT are 405 on any path and never forwarded: a provider that reflects TRACE never shows its key")
    func traceAndConnect() async throws {
        try await Self.withGateway { h, provider, key in
            for path in ["/v1/messages", "/v1/anything", "/healthz", "/admin/v1/plans", "/nowhere"] {
                let reply = try await UpstreamStrictnessTests.raw(
                    h, "TRACE \(path) HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\nconnection: close\r\n\r\n")
                #expect(reply.status == 405, "\(path)")
                #expect(!reply.body.contains("provider-secret-key"))
            }
            let connect = try await UpstreamStrictnessTests.raw(
                h, "CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: 127.0.0.1:443\r\nx-api-key: \(key)\r\nconnection: close\r\n\r\n")
            #expect(connect.status == 405 || connect.status == 400)
            // Without `connection: close` the gateway still closes after its 405 (an answer to
            // CONNECT carries no body, so a client reads to the close): no client waits for it.
            let started = ContinuousClock.now
            let open = try await UpstreamStrictnessTests.raw(
                h, "CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: 127.0.0.1:443\r\nx-api-key: \(key)\r\n\r\n")
            #expect(open.status == 405)
            #expect(ContinuousClock.now - started < .seconds(5), "CONNECT's 405 left the connection open")
            // Without a credential the proxy's 401 comes first (SPEC §2's order).
            let anonymous = try await UpstreamStrictnessTests.raw(h, "TRACE /v1/messages HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
            #expect(anonymous.status == 401)
            #expect(provider.requests.isEmpty)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
        }
    }

    @Test("a compressed request body is 415 from the head; identity passes; method overrides never reach the provider")
    func encodingsAndOverrides() async throws {
        try await Self.withGateway { h, provider, key in
            let body = #"{"model":"m","max_tokens":8,"messages":[]}"#
            for coding in ["gzip", "br", "deflate", "identity, gzip", "x-custom"] {
                let reply = try await Self.post(h, "/v1/messages", key: key, body: body, headers: [("content-encoding", coding)])
                #expect(reply.status == 415, "\(coding)")
                #expect(reply.json["error"]?["type"]?.stringValue == "invalid_request_error")
            }
            // Two Content-Type fields: which one decides whether the body is read would depend on the reader.
            let twoTypes = try await h.request(
                .POST, "/v1/messages", headers: [("x-api-key", key), ("content-type", "text/plain"), ("content-type", "application/json")],
                body: body)
            #expect(twoTypes.status == 400)
            // SPEC §2's order (415, 413, 400): a compressed body or a too large one is refused as
            // such before its two Content-Type fields are.
            let twoTypesGzip = try await h.request(
                .POST, "/v1/messages",
                headers: [
                    ("x-api-key", key), ("content-type", "text/plain"), ("content-type", "application/json"), ("content-encoding", "gzip"),
                ],
                body: body)
            #expect(twoTypesGzip.status == 415)
            let twoTypesHuge = try await UpstreamStrictnessTests.raw(
                h,
                "POST /v1/messages HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\ncontent-type: text/plain\r\n"
                    + "content-type: application/json\r\ncontent-length: 400000000\r\nconnection: close\r\n\r\n")
            #expect(twoTypesHuge.status == 413)
            #expect(provider.requests.isEmpty)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger") == 0)
            let identity = try await Self.post(h, "/v1/messages", key: key, body: body, headers: [("content-encoding", "identity")])
            #expect(identity.status == 200)
            let overridden = try await Self.post(
                h, "/v1/messages", key: key, body: body,
                headers: [("x-http-method-override", "GET"), ("x-http-method", "DELETE"), ("x-method-override", "PUT")])
            #expect(overridden.status == 200)
            let sent = try #require(provider.requests.last)
            #expect(sent.line == "POST /v1/messages")
            #expect(sent.headers["x-http-method-override"] == nil && sent.headers["x-http-method"] == nil)
            #expect(sent.headers["x-method-override"] == nil)
            // A reverse proxy's notes on the end user stop here (docs/configuration.md, TLS on the listener).
            let proxied = try await Self.post(
                h, "/v1/messages", key: key, body: body,
                headers: [
                    ("x-forwarded-for", "203.0.113.7"), ("x-forwarded-proto", "https"), ("x-forwarded-host", "gw.example"),
                    ("forwarded", "for=203.0.113.7"), ("x-real-ip", "203.0.113.7"), ("via", "1.1 nginx"),
                ])
            #expect(proxied.status == 200)
            let viaProxy = try #require(provider.requests.last)
            for name in ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "forwarded", "x-real-ip", "via"] {
                #expect(viaProxy.headers[name] == nil, "\(name) reached the provider")
            }
        }
    }

    @Test("the provider account's rate limits, organisation and cookies never reach a tenant")
    func accountWideFields() async throws {
        try await Self.withGateway { h, _, key in
            let reply = try await UpstreamStrictnessTests.raw(
                h, "GET /v1/headers HTTP/1.1\r\nhost: gw\r\nx-api-key: \(key)\r\nconnection: close\r\n\r\n")
            #expect(reply.status == 200)
            for name in reply.headers.keys {
                #expect(!name.hasPrefix("anthropic-ratelimit-") && !name.hasPrefix("x-ratelimit-"), "\(name)")
                #expect(!name.hasPrefix("anthropic-organization-") && name != "set-cookie", "\(name)")
            }
            #expect(reply.headers["x-kept"] == "end-to-end")
        }
    }

    @Test("an Idempotency-Key on a free call is ignored: nothing stored, each call forwarded")
    func freeCallKeys() async throws {
        try await Self.withGateway { h, provider, key in
            for n in 0..<5 {
                let reply = try await h.request(.GET, "/v1/models", headers: [("x-api-key", key), ("idempotency-key", "free-\(n)")])
                #expect(reply.status == 200)
                #expect(reply.headers.first(name: "idempotent-replayed") == nil)
            }
            let again = try await h.request(.GET, "/v1/models", headers: [("x-api-key", key), ("idempotency-key", "free-0")])
            #expect(again.headers.first(name: "idempotent-replayed") == nil)
            #expect(provider.requests.count == 6)
            #expect(try await h.scalar("SELECT count(*) FROM idempotency_keys") == 0)
            // A metered call still keeps its key.
            let body = #"{"model":"m","max_tokens":8,"messages":[]}"#
            #expect(try await Self.post(h, "/v1/messages", key: key, body: body, headers: [("idempotency-key", "paid")]).status == 200)
            #expect(try await h.scalar("SELECT count(*) FROM idempotency_keys") == 1)
        }
    }

    @Test("/metrics answers the operator token or metrics.token only, unless metrics.public")
    func metricsAccess() async throws {
        let token = "metrics-reader-" + UUID().uuidString
        try await Harness.with(settings: ["metrics.token": token]) { h in
            #expect(try await h.request(.GET, "/metrics").status == 401)
            #expect(try await h.request(.GET, "/metrics", headers: [("authorization", "Bearer wrong")]).status == 401)
            let byOperator = try await h.request(.GET, "/metrics", headers: h.asOperator)
            #expect(byOperator.status == 200 && byOperator.body.contains("capgate_"))
            #expect(try await h.request(.GET, "/metrics", headers: [("authorization", "Bearer \(token)")]).status == 200)
            // A company admin's valid key: authenticated, but not allowed (403); a revoked one is 401.
            try await h.createPlan("p", company: nil, user: nil)
            let (_, admins) = try await h.createCompany(plan: "p", users: 1, role: "admin")
            for headers in [[("x-api-key", admins[0].key)], [("authorization", "Bearer \(admins[0].key)")]] {
                let reply = try await h.request(.GET, "/metrics", headers: headers)
                #expect(reply.status == 403 && reply.json["error"]?["type"]?.stringValue == "permission_error", "\(reply.body)")
            }
            #expect(try await h.request(.GET, "/metrics", headers: [("x-api-key", "cg_not_a_key")]).status == 401)
        }
        try await Harness.with(settings: ["metrics.public": "true"]) { h in
            let reply = try await h.request(.GET, "/metrics")
            #expect(reply.status == 200)
        }
    }

    static func base64URL(_ data: some Sequence<UInt8>) -> String {
        Data(data).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// An HS256 token over exactly `payload` (a JSON library would not write a repeated claim).
    static func signed(_ payload: String, secret: String = JWTTests.secret, header: String = #"{"alg":"HS256","typ":"JWT"}"#) -> String {
        let signingInput = base64URL(Array(header.utf8)) + "." + base64URL(Array(payload.utf8))
        let mac = HMAC<SHA256>.authenticationCode(for: Array(signingInput.utf8), using: SymmetricKey(data: Array(secret.utf8)))
        return signingInput + "." + base64URL(Array(mac))
    }

    @Test(
        "a JWT with a repeated claim (at any depth) is 401; jwt.maxLifetime refuses long-lived tokens; a short jwt.secret stops the start")
    func jwtDoors() async throws {
        await #expect(throws: ConfigurationError.self) {
            _ = try await CapGateConfiguration.load(
                flags: ["jwt.secret": "too-short-0123456789"], environment: [:], file: "/nonexistent.json")
        }
        try await Harness.with(settings: ["jwt.secret": JWTTests.secret, "jwt.maxLifetime": "3600"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let (other, _) = try await h.createCompany(plan: "low", users: 1)
            let now = Int(Date().timeIntervalSince1970)
            let sub = users[0].id.text
            func status(_ payload: String) async throws -> Int {
                try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(Self.signed(payload))")]).status
            }
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 600),"iat":\#(now)}"#) == 200)
            #expect(
                try await status(
                    #"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 600),"company_id":"\#(other.text)"}"#) == 401)
            #expect(
                try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 600),"meta":{"a":1,"\u0061":2}}"#)
                    == 401)
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 600),"x":"\udc00"}"#) == 401)
            // Longer than jwt.maxLifetime from iat, or from now without iat.
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 7200),"iat":\#(now)}"#) == 401)
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 7200)}"#) == 401)
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 1800)}"#) == 200)
            // The header's alg must be what the gateway verifies (HS256 with jwt.secret): an
            // HMAC-SHA256 signature under another alg, or none, is not a valid token.
            let claims = #"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 600)}"#
            for header in [#"{"alg":"HS384","typ":"JWT"}"#, #"{"alg":"RS256"}"#, #"{"alg":"none"}"#, #"{"typ":"JWT"}"#] {
                let reply = try await h.request(
                    .GET, "/v1/usage", headers: [("authorization", "Bearer \(Self.signed(claims, header: header))")])
                #expect(reply.status == 401, "\(header): \(reply.body)")
            }
            #expect(try await status(claims) == 200)
            // Exactly at the limit is taken; 30 s past it is not (no leeway unless jwt.leeway is set).
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 3600),"iat":\#(now)}"#) == 200)
            #expect(try await status(#"{"sub":"\#(sub)","company_id":"\#(company.text)","exp":\#(now + 3630),"iat":\#(now)}"#) == 401)
        }
    }
}
