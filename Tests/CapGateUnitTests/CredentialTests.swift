import Foundation
import HTTPTypes
import Testing

@testable import CapGate

/// What a credential must be before the database is asked (Auth/): a JWT's registered claims
/// (SPEC §2, §7), its parts as I-JSON, the API key format and its stored hash, secret
/// comparison, and the Standard Webhooks signature of SPEC §9.
@Suite("Credentials: JWT claims, token parts, API keys, webhook signatures")
struct CredentialTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let t = 1_800_000_000

    static func refusal(_ claims: JSON, _ rules: JWTClaimRules = .init()) -> GatewayError? {
        UnitTestSupport.refusal { try rules.check(claims, now: now) }
    }

    static func token(header: String = #"{"alg":"HS256","typ":"JWT"}"#, payload: String) -> String {
        UnitTestSupport.base64URL(Array(header.utf8)) + "." + UnitTestSupport.base64URL(Array(payload.utf8)) + ".c2ln"
    }

    @Test("exp is required and must be a number; a token is expired from its exp second on, later with jwt.leeway")
    func expiry() {
        for claims: JSON in [.obj([:]), .obj(["exp": "1800000100"]), .obj(["exp": .null])] {
            let error = Self.refusal(claims)
            #expect(error?.status == .unauthorized && error?.type == "authentication_error")
            #expect(error?.message == "The token has no exp claim; CapGate accepts only tokens that expire.")
        }
        #expect(Self.refusal(.obj(["exp": .int(Int64(Self.t + 1))])) == nil)
        #expect(Self.refusal(.obj(["exp": .double(Double(Self.t) + 0.5)])) == nil)
        for exp in [Self.t, Self.t - 1] {
            #expect(Self.refusal(.obj(["exp": .int(Int64(exp))]))?.message == "The token has expired. Sign in again.")
        }
        let leeway = JWTClaimRules(leeway: 30)
        #expect(Self.refusal(.obj(["exp": .int(Int64(Self.t - 29))]), leeway) == nil)
        #expect(Self.refusal(.obj(["exp": .int(Int64(Self.t - 30))]), leeway) != nil)
    }

    @Test("nbf, when present, must be a number not in the future (leeway allowed)")
    func notBefore() {
        let exp = JSON.int(Int64(Self.t + 600))
        #expect(Self.refusal(.obj(["exp": exp, "nbf": .int(Int64(Self.t))])) == nil)
        #expect(
            Self.refusal(.obj(["exp": exp, "nbf": .int(Int64(Self.t + 1))]))?.message
                == "The token is not valid yet (its nbf claim is in the future).")
        #expect(Self.refusal(.obj(["exp": exp, "nbf": "soon"]))?.message == "The token's nbf claim must be a number of seconds.")
        let leeway = JWTClaimRules(leeway: 10)
        #expect(Self.refusal(.obj(["exp": exp, "nbf": .int(Int64(Self.t + 10))]), leeway) == nil)
        #expect(Self.refusal(.obj(["exp": exp, "nbf": .int(Int64(Self.t + 11))]), leeway) != nil)
    }

    @Test("jwt.maxLifetime (SPEC §7): exp − iat, or exp − now without iat, at most the limit (plus leeway)")
    func maxLifetime() {
        let rules = JWTClaimRules(maxLifetime: 3_600)
        func claims(exp: Int, iat: JSON? = nil) -> JSON {
            var fields: [JSON.Field] = [.init("exp", .int(Int64(exp)))]
            if let iat { fields.append(.init("iat", iat)) }
            return .object(fields)
        }
        #expect(Self.refusal(claims(exp: Self.t + 3_600, iat: .int(Int64(Self.t))), rules) == nil)
        #expect(Self.refusal(claims(exp: Self.t + 3_600), rules) == nil)
        // Issued an hour ago, valid for another 90 minutes: 150 minutes in all.
        #expect(Self.refusal(claims(exp: Self.t + 5_400, iat: .int(Int64(Self.t - 3_600))), rules) != nil)
        let long = Self.refusal(claims(exp: Self.t + 3_601), rules)
        #expect(long?.message.contains("(3600 seconds from iat to exp)") == true)
        #expect(Self.refusal(claims(exp: Self.t + 60, iat: "now"), rules)?.message == "The token's iat claim must be a number of seconds.")
        let lenient = JWTClaimRules(leeway: 5, maxLifetime: 3_600)
        #expect(Self.refusal(claims(exp: Self.t + 3_605), lenient) == nil)
        #expect(Self.refusal(claims(exp: Self.t + 3_606), lenient) != nil)
        #expect(Self.refusal(claims(exp: Self.t + 86_400 * 365)) == nil)
    }

    @Test("iss must equal jwt.issuer and aud (a string or a list) contain jwt.audience when configured, else they are not read")
    func issuerAndAudience() {
        let exp = JSON.int(Int64(Self.t + 60))
        let rules = JWTClaimRules(audience: "capgate", issuer: "https://id.example")
        #expect(Self.refusal(.obj(["exp": exp, "iss": "https://id.example", "aud": "capgate"]), rules) == nil)
        #expect(Self.refusal(.obj(["exp": exp, "iss": "https://id.example", "aud": .array(["other", .int(1), "capgate"])]), rules) == nil)
        let wrongIssuer = Self.refusal(.obj(["exp": exp, "iss": "https://evil.example", "aud": "capgate"]), rules)
        #expect(wrongIssuer?.message.hasPrefix("The token's issuer (iss) is not 'https://id.example'") == true)
        for aud: JSON? in [nil, "Capgate", .array(["other"]), .array([]), .int(1)] {
            var fields: [JSON.Field] = [.init("exp", exp), .init("iss", "https://id.example")]
            if let aud { fields.append(.init("aud", aud)) }
            #expect(Self.refusal(.object(fields), rules)?.message.contains("audience (aud) does not include 'capgate'") == true)
        }
        #expect(Self.refusal(.obj(["exp": exp, "iss": "anyone", "aud": "anything"])) == nil)
        // The first failing claim is the one named: expiry before the issuer.
        #expect(
            Self.refusal(.obj(["exp": .int(1), "iss": "https://evil.example"]), rules)?.message == "The token has expired. Sign in again.")
    }

    @Test("a token's header and payload must each be I-JSON (SPEC §7): a repeated claim or a lone surrogate is 401 before any signature")
    func tokenParts() throws {
        let header = try Authenticator.checkIJSON(Self.token(payload: #"{"sub":"u1","exp":1}"#))
        #expect(header["alg"] == .string("HS256"))
        let repeated = UnitTestSupport.refusal { try Authenticator.checkIJSON(Self.token(payload: #"{"sub":"u1","sub":"u2"}"#)) }
        #expect(repeated?.status == .unauthorized)
        #expect(repeated?.message == #"The token's header or payload is not I-JSON: the member name "sub" appears twice in one object."#)
        for token in [
            Self.token(payload: #"{"app":{"company_id":"a","company_id":"b"}}"#), Self.token(payload: #"{"sub":"\ud800"}"#),
            Self.token(header: #"{"alg":"HS256","alg":"none"}"#, payload: "{}"), Self.token(payload: #"{"exp":1} x"#),
            Self.token(payload: String(repeating: "[", count: 33) + String(repeating: "]", count: 33)),
        ] {
            #expect(UnitTestSupport.refusal { try Authenticator.checkIJSON(token) }?.type == "authentication_error", "\(token)")
        }
        let notBase64 = UnitTestSupport.refusal { try Authenticator.checkIJSON("e30=.e30.sig") }
        #expect(notBase64?.message == "The token is not a valid JWT: a part is not base64url.")
    }

    @Test("base64url: '-' and '_' for '+' and '/', no padding written or accepted")
    func base64URL() {
        #expect(Authenticator.base64URLDecoded("") == [])
        #expect(Authenticator.base64URLDecoded("YQ") == [0x61])
        #expect(Authenticator.base64URLDecoded("YWI") == [0x61, 0x62])
        #expect(Authenticator.base64URLDecoded("-_8") == [0xFB, 0xFF])
        for text in ["YQ==", "YQ=", "a*b", "Y", "e30=="] {
            #expect(Authenticator.base64URLDecoded(Substring(text)) == nil, "\(text)")
        }
    }

    @Test(
        "an API key is cg_ and 32 random bytes in base64url (43 characters); its visible prefix is 11 characters; only the SHA-256 is kept")
    func apiKeys() {
        let made = (0..<200).map { _ in ApiKeyGenerator.make() }
        let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        for (key, prefix, hash) in made {
            #expect(key.hasPrefix("cg_") && key.count == 46, "\(key)")
            #expect(key.dropFirst(3).allSatisfy(alphabet.contains), "\(key)")
            #expect(prefix == String(key.prefix(11)))
            #expect(hash == ApiKeyGenerator.hash(key) && hash.readableBytes == 32)
        }
        #expect(Set(made.map { $0.key }).count == made.count)
        // SHA-256("abc"), FIPS 180-2's example.
        #expect(
            UnitTestSupport.hex(ApiKeyGenerator.hash("abc").readableBytesView)
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test("random tokens: ceil(4n/3) base64url characters for n bytes, never padding")
    func randomTokens() {
        for bytes in 0...40 {
            let token = ApiKeyGenerator.randomToken(bytes: bytes)
            #expect(token.count == (4 * bytes + 2) / 3, "\(bytes)")
            #expect(!token.contains("=") && !token.contains("+") && !token.contains("/"), "\(bytes)")
        }
    }

    @Test("secrets compare equal only when identical: a difference at the first or last character, a prefix, case")
    func constantTime() {
        let secret = "op-" + String(repeating: "x", count: 40)
        #expect(ApiKeyGenerator.constantTimeEquals(secret, secret))
        #expect(ApiKeyGenerator.constantTimeEquals("", ""))
        for other in [
            "Op-" + String(repeating: "x", count: 40), "op-" + String(repeating: "x", count: 39) + "y", String(secret.dropLast()),
            secret + " ", secret.uppercased(), "",
        ] {
            #expect(!ApiKeyGenerator.constantTimeEquals(secret, other), "\(other)")
        }
    }

    @Test("webhook signatures are Standard Webhooks': the specification's own example, a whsec_ key decoded, a plain one as bytes")
    func webhookSigning() {
        // The example of the Standard Webhooks specification.
        let body = Array(#"{"test": 2432232314}"#.utf8)
        #expect(
            WebhookSignature.sign(
                id: "msg_p5jXN8AQM9LWM0D4loKWxJek", timestamp: 1_614_265_330, body: body, secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        // Python: base64(hmac.new(b"plain-secret", b"id1.1700000000.hello", sha256).digest())
        #expect(
            WebhookSignature.sign(id: "id1", timestamp: 1_700_000_000, body: Array("hello".utf8), secret: "plain-secret")
                == "v1,Mnaemqm5xy1fIA1W8NyaxVUFDXIanV2EHi2j7/FzTCs=")
    }

    @Test("a signature header verifies when any of its space-separated entries matches; another id, time, body or secret does not")
    func webhookVerify() {
        let good = "v1,Mnaemqm5xy1fIA1W8NyaxVUFDXIanV2EHi2j7/FzTCs="
        func verify(
            _ header: String, id: String = "id1", timestamp: Int = 1_700_000_000, body: [UInt8] = Array("hello".utf8),
            secret: String = "plain-secret"
        ) -> Bool {
            WebhookSignature.verify(id: id, timestamp: timestamp, body: body, secret: secret, header: header)
        }
        #expect(verify(good))
        #expect(verify("v1,AAAA " + good))
        #expect(!verify(good, id: "id2") && !verify(good, timestamp: 1_700_000_001) && !verify(good, body: Array("hello!".utf8)))
        #expect(!verify(good, secret: "plain-secreT"))
        #expect(!verify("") && !verify("v1,") && !verify(String(good.dropLast())) && !verify("v2," + good.dropFirst(3)))
    }
}
