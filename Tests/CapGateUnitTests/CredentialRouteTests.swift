import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import NIOCore
import Testing

@testable import CapGate

/// Credentials refused before the database is asked, through the gateway's real router
/// (``GatewayRouterTests/router(flags:)``: a PostgreSQL that is never reached): a malformed
/// Authorization header, a bearer token of no known kind, and JWTs (HS256, signed here) whose
/// form, algorithm, signature or claims fail (SPEC §2, §3: 401 `authentication_error`).
@Suite("Credentials refused before the database", .timeLimit(.minutes(1)))
struct CredentialRouteTests {
    static let secret = String(repeating: "k", count: 40)
    static let user = "6f1c2a7e-93d4-4a55-9c61-0f3e2b1d9a10"
    static let company = "0b8e7f52-1d34-4c2a-9e55-3a6b2c1d0e9f"
    static let later = Int(Date().timeIntervalSince1970) + 3_600

    /// An HS256 JWT over `payload` (JSON text).
    static func jwt(_ payload: String, alg: String = "HS256", secret: String = CredentialRouteTests.secret) -> String {
        let head = UnitTestSupport.base64URL(Array(#"{"alg":"\#(alg)","typ":"JWT"}"#.utf8))
        let body = UnitTestSupport.base64URL(Array(payload.utf8))
        let mac = HMAC<SHA256>.authenticationCode(for: Array("\(head).\(body)".utf8), using: SymmetricKey(data: Array(secret.utf8)))
        return "\(head).\(body).\(UnitTestSupport.base64URL(Array(mac)))"
    }

    /// The status and error message of `GET /v1/usage` with `headers`, on a gateway with `flags`.
    static func refusals(
        _ headers: [HTTPFields], flags: [String: String] = ["jwt.secret": CredentialRouteTests.secret]
    ) async throws -> [(Int, String?)] {
        try await Application(router: try await GatewayRouterTests.router(flags: flags)).test(.router) { client in
            var answers: [(Int, String?)] = []
            for fields in headers {
                let response = try await client.execute(uri: "/v1/usage", method: .get, headers: fields)
                let json = try? JSONParser.parse(response.body)
                #expect(json?["error"]?["type"]?.stringValue == "authentication_error", "\(fields)")
                answers.append((Int(response.status.code), json?["error"]?["message"]?.stringValue))
            }
            return answers
        }
    }

    static func bearer(_ token: String) -> HTTPFields { [.authorization: "Bearer \(token)"] }

    @Test("an Authorization header that is not 'Bearer <token>' is 401 saying so; an empty x-api-key is no credential")
    func malformedHeader() async throws {
        let answers = try await Self.refusals([
            [.authorization: "Basic dXNlcjpwYXNz"], [.authorization: "Bearer"], [.authorization: "Token abc"], [.xAPIKey: ""],
        ])
        #expect(answers.map { $0.0 } == [401, 401, 401, 401])
        #expect(answers.prefix(3).allSatisfy { $0.1 == "The Authorization header must be 'Bearer <token>'." })
        #expect(answers[3].1?.hasPrefix("No credential") == true)
    }

    @Test("a bearer token that is no API key, no operator token and no JWT is 401")
    func unknownBearer() async throws {
        let answers = try await Self.refusals([Self.bearer("abc"), Self.bearer("a.b"), Self.bearer("a.b.c.d")])
        #expect(answers.allSatisfy { $0.0 == 401 && $0.1 == "The bearer token is not a valid CapGate API key or token." })
    }

    @Test("with no JWT key configured a JWT is 401 saying tokens are not accepted")
    func noKeys() async throws {
        let token = Self.jwt(#"{"sub":"\#(Self.user)","company_id":"\#(Self.company)","exp":\#(Self.later)}"#)
        let answers = try await Self.refusals([Self.bearer(token)], flags: [:])
        #expect(answers.first?.1 == "Tokens are not accepted by this gateway: no JWT keys are configured.")
    }

    @Test("a JWT of the wrong form, algorithm or signature is 401 before its claims are read")
    func tokenForm() async throws {
        let claims = #"{"sub":"\#(Self.user)","company_id":"\#(Self.company)","exp":\#(Self.later)}"#
        let answers = try await Self.refusals([
            Self.bearer(Self.jwt(#"{"sub":"a","sub":"b","exp":\#(Self.later)}"#)), Self.bearer(Self.jwt(claims, alg: "HS512")),
            Self.bearer(Self.jwt(claims, secret: String(repeating: "z", count: 40))), Self.bearer(Self.jwt(claims, alg: "none")),
        ])
        #expect(answers.map { $0.0 } == [401, 401, 401, 401])
        #expect(answers[0].1?.hasPrefix("The token's header or payload is not I-JSON") == true)
        #expect(answers[1].1 == "The token's alg must be HS256, as this gateway verifies it.")
        #expect(answers[2].1 == "The token's signature or format is not valid.")
        #expect(answers[3].1 == "The token's alg must be HS256, as this gateway verifies it.")
    }

    @Test("a well-signed JWT is 401 when it expired, its sub is no UUID, it names no company or binds a feature badly")
    func tokenClaims() async throws {
        let answers = try await Self.refusals([
            Self.bearer(Self.jwt(#"{"sub":"\#(Self.user)","company_id":"\#(Self.company)","exp":1000}"#)),
            Self.bearer(Self.jwt(#"{"sub":"alice","company_id":"\#(Self.company)","exp":\#(Self.later)}"#)),
            Self.bearer(Self.jwt(#"{"sub":"\#(Self.user)","org":{"id":"\#(Self.company)"},"exp":\#(Self.later)}"#)),
            Self.bearer(Self.jwt(#"{"sub":"\#(Self.user)","company_id":"\#(Self.company)","capgate_features":5,"exp":\#(Self.later)}"#)),
            Self.bearer(Self.jwt(#"{"sub":"\#(Self.user)","company_id":"\#(Self.company)"}"#)),
        ])
        #expect(answers.map { $0.0 } == [401, 401, 401, 401, 401])
        #expect(answers[0].1 == "The token has expired. Sign in again.")
        #expect(answers[1].1 == "The token's sub claim must be the user's UUID.")
        #expect(answers[2].1 == "The token has no company UUID at claim 'company_id'.")
        #expect(answers[3].1?.hasPrefix("The token's claim 'capgate_features' must be a feature id or a list of feature ids") == true)
        #expect(answers[4].1 == "The token has no exp claim; CapGate accepts only tokens that expire.")
    }

    @Test("jwt.companyClaim names a nested path: a token without a company there is refused naming the path")
    func companyClaimPath() async throws {
        let token = Self.jwt(#"{"sub":"\#(Self.user)","company_id":"\#(Self.company)","exp":\#(Self.later)}"#)
        let answers = try await Self.refusals(
            [Self.bearer(token)], flags: ["jwt.secret": Self.secret, "jwt.companyClaim": "app_metadata.company_id"])
        #expect(answers.first?.1 == "The token has no company UUID at claim 'app_metadata.company_id'.")
    }

    @Test("the operator token makes no metered call: 403 permission_error, answered without the database")
    func operatorOnProxy() async throws {
        try await Application(router: try await GatewayRouterTests.router()).test(.router) { client in
            let response = try await client.execute(
                uri: "/v1/messages", method: .post, headers: Self.bearer(GatewayRouterTests.operatorToken), body: ByteBuffer(string: "{}"))
            let json = try? JSONParser.parse(response.body)
            #expect(response.status == .forbidden && json?["error"]?["type"]?.stringValue == "permission_error")
            #expect(
                json?["error"]?["message"]?.stringValue == "The operator token cannot make metered calls; use a user's CapGate API key.")
        }
    }
}
