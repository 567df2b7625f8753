import CapGate
import Foundation
import JWTKit
import NIOHTTP1
import Testing

/// Claims as an identity provider would issue them.
struct TestClaims: JWTPayload {
    var sub: String
    var exp: Int?
    var company_id: String?
    var app_metadata: [String: String]?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

@Suite("JWT credentials", .timeLimit(.minutes(5)))
struct JWTTests {
    static let secret = "test-secret-that-is-long-enough-0123456789"

    static func hs256(_ claims: TestClaims, secret: String = JWTTests.secret) async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return try await keys.sign(claims)
    }

    static var inAnHour: Int { Int(Date().timeIntervalSince1970) + 3600 }

    @Test("HS256: sub is the user, the company comes from the claim; a user unknown in that company is 401")
    func hs256() async throws {
        try await Harness.with(settings: ["jwt.secret": Self.secret]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let token = try await Self.hs256(TestClaims(sub: users[0].id.text, exp: Self.inAnHour, company_id: company.text))
            let reply = try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(token)")])
            #expect(reply.status == 200)
            let call = try await h.request(
                .POST, "/v1/messages", headers: [("authorization", "Bearer \(token)")], json: .obj(["model": "m", "max_tokens": 5])
            )
            #expect(call.status == 200)
            #expect(try await h.scalar("SELECT used FROM user_usage WHERE user_id = '\(users[0].id.text)'") == 1)

            let stranger = UUID()
            let unknown = try await Self.hs256(TestClaims(sub: stranger.text, exp: Self.inAnHour, company_id: company.text))
            for (method, path) in [(HTTPMethod.GET, "/v1/usage"), (.POST, "/v1/messages")] {
                let refused = try await h.request(
                    method, path, headers: [("authorization", "Bearer \(unknown)")], json: .obj(["model": "m", "max_tokens": 5]))
                #expect(refused.status == 401)
                #expect(refused.json["error"]?["type"]?.stringValue == "authentication_error")
            }
            #expect(try await h.scalar("SELECT count(*) FROM users WHERE id = '\(stranger.text)'") == 0)
            #expect(try await h.scalar("SELECT count(*) FROM usage_ledger WHERE company_id = '\(company.text)'") == 1)
        }
    }

    @Test("expired, exp-less, badly signed, unknown-company and wrong-company tokens are 401")
    func refused() async throws {
        try await Harness.with(settings: ["jwt.secret": Self.secret]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let (other, _) = try await h.createCompany(plan: "low", users: 1)
            let expired = try await Self.hs256(
                TestClaims(sub: users[0].id.text, exp: Int(Date().timeIntervalSince1970) - 60, company_id: company.text))
            // Just expired: no leeway unless `jwt.leeway` is set (SPEC §3: an expired JWT is 401).
            let justExpired = try await Self.hs256(
                TestClaims(sub: users[0].id.text, exp: Int(Date().timeIntervalSince1970) - 2, company_id: company.text))
            let noExp = try await Self.hs256(TestClaims(sub: users[0].id.text, exp: nil, company_id: company.text))
            let forged = try await Self.hs256(
                TestClaims(sub: users[0].id.text, exp: Self.inAnHour, company_id: company.text),
                secret: "another-secret-0123456789-abcdefghij")
            let unknownCompany = try await Self.hs256(TestClaims(sub: UUID().text, exp: Self.inAnHour, company_id: UUID().text))
            // A user of one company presenting another company's id.
            let crossCompany = try await Self.hs256(TestClaims(sub: users[0].id.text, exp: Self.inAnHour, company_id: other.text))
            for token in [expired, justExpired, noExp, forged, unknownCompany, crossCompany, "a.b.c"] {
                let reply = try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(token)")])
                #expect(reply.status == 401, "token should be refused: \(reply.body)")
                #expect(reply.json["error"]?["type"]?.stringValue == "authentication_error")
            }
        }
    }

    @Test("a nested company claim path and ES256 keys from a JWKS file")
    func jwksAndNestedClaim() async throws {
        let key = ES256PrivateKey()
        let (x, y) = key.parameters!
        let jwks = #"{"keys":[{"kty":"EC","crv":"P-256","alg":"ES256","kid":"k1","use":"sig","x":"\#(x)","y":"\#(y)"}]}"#
        let file = NSTemporaryDirectory() + "jwks-\(UUID().uuidString).json"
        try jwks.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        try await Harness.with(settings: ["jwt.jwksFile": file, "jwt.companyClaim": "app_metadata.company_id"]) { h in
            try await h.createPlan("low", company: 100, user: 25)
            let (company, users) = try await h.createCompany(plan: "low", users: 1)
            let signer = JWTKeyCollection()
            await signer.add(ecdsa: key, kid: "k1")
            let token = try await signer.sign(
                TestClaims(sub: users[0].id.text, exp: Self.inAnHour, company_id: nil, app_metadata: ["company_id": company.text]),
                kid: "k1"
            )
            let reply = try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(token)")])
            #expect(reply.status == 200, "\(reply.body)")
            // The top-level claim is not where this gateway looks.
            let flat = try await signer.sign(TestClaims(sub: users[0].id.text, exp: Self.inAnHour, company_id: company.text), kid: "k1")
            #expect(try await h.request(.GET, "/v1/usage", headers: [("authorization", "Bearer \(flat)")]).status == 401)
        }
    }
}
