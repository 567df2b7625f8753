import Foundation
import HTTPTypes
import JWTKit
import Logging
import PostgresNIO

/// Turns a request's credential into an ``Identity``.
///
/// Order (SPEC §2): `x-api-key`, then `Authorization: Bearer` holding the operator token, a
/// CapGate key or a JWT (HS256 with `jwt.secret`, RS256/ES256 from `jwt.jwksFile`; `exp`
/// required, `sub` = user id, company id from `jwt.companyClaim`, the features it may be charged
/// to from `jwt.featureClaim`; `aud`, `iss` and the clock leeway per ``JWTClaimRules``).
public struct Authenticator: Sendable {
    /// Where API keys and a token's user are looked up (PostgreSQL, or an in-memory store in tests).
    let credentials: any CredentialStore
    /// `operator.token` and `operator.tokens`, each with its name.
    let operatorTokens: [OperatorToken]
    /// The keys a token's header `alg` selects (SPEC §2): `HS256` the `jwt.secret`, `RS256` and
    /// `ES256` the `jwt.jwksFile`'s keys; empty when neither is configured.
    let jwtKeys: [String: JWTKeyCollection]
    let companyClaim: String
    /// `jwt.featureClaim`: where a token names the features it may be charged to; nil: not read.
    let featureClaim: String?
    /// `exp`/`nbf` with leeway, and `aud`/`iss` when configured.
    let claimRules: JWTClaimRules
    /// Where a key that authenticated is noted for its `last_used_at`; nil: not noted.
    let keyUsage: KeyUsage?

    public init(database: Database, configuration: CapGateConfiguration, keyUsage: KeyUsage? = nil) async throws {
        try await self.init(credentials: PostgresCredentials(database: database), configuration: configuration, keyUsage: keyUsage)
    }

    package init(credentials: any CredentialStore, configuration: CapGateConfiguration, keyUsage: KeyUsage? = nil) async throws {
        self.credentials = credentials
        self.keyUsage = keyUsage
        self.operatorTokens = configuration.operators.all
        self.companyClaim = configuration.jwt.companyClaim
        self.featureClaim = configuration.jwt.featureClaim
        self.claimRules = JWTClaimRules(configuration: configuration)
        var keys: [String: JWTKeyCollection] = [:]
        if let secret = configuration.jwt.secret {
            let hmac = JWTKeyCollection()
            await hmac.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
            keys["HS256"] = hmac
        }
        if let file = configuration.jwt.jwksFile {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                throw ConfigurationError(key: "jwt.jwksFile", problem: "names a file that cannot be read: \(file)")
            }
            let jwks = JWTKeyCollection()
            do {
                try await jwks.add(jwksJSON: text)
            } catch {
                throw ConfigurationError(key: "jwt.jwksFile", problem: "is not a valid JWKS document")
            }
            keys["RS256"] = jwks
            keys["ES256"] = jwks
        }
        self.jwtKeys = keys
    }

    /// The identity behind `headers`, or a 401 ``GatewayError``.
    public func authenticate(_ headers: HTTPFields) async throws -> Identity {
        if let key = apiKey(in: headers) {
            return try await identity(forKey: key)
        }
        guard let authorization = headers[.authorization] else {
            throw GatewayError.authentication(
                "No credential: send your CapGate API key in the x-api-key header or as Authorization: Bearer.")
        }
        let parts = authorization.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else {
            throw GatewayError.authentication("The Authorization header must be 'Bearer <token>'.")
        }
        let token = parts[1].trimmingCharacters(in: .whitespaces)
        if let match = OperatorToken.match(token, in: operatorTokens) {
            return .operator(name: match.name)
        }
        if token.split(separator: ".", omittingEmptySubsequences: false).count == 3 {
            return try await identity(forJWT: token)
        }
        throw GatewayError.authentication("The bearer token is not a valid CapGate API key or token.")
    }

    /// The CapGate API key a request presents, by the same precedence as ``authenticate(_:)``
    /// (`x-api-key`, then a `Bearer cg_…` that is not the operator token); nil for anything else.
    /// The proxy authenticates such keys inside the admission round trip.
    public func apiKey(in headers: HTTPFields) -> String? {
        if let key = headers[.xAPIKey], !key.isEmpty { return key }
        guard let authorization = headers[.authorization], authorization.count > 7,
            authorization.prefix(7).lowercased() == "bearer "
        else { return nil }
        let token = authorization.dropFirst(7).trimmingCharacters(in: .whitespaces)
        guard token.hasPrefix(ApiKeyGenerator.keyPrefix) else { return nil }
        if OperatorToken.match(token, in: operatorTokens) != nil { return nil }
        return token
    }

    /// The 401 for a key the database did not accept.
    static func keyError(_ check: KeyCheck) -> GatewayError {
        switch check {
        case .revokedKey: GatewayError.authentication("This API key was revoked. Ask your administrator for a new one.")
        case .expiredKey: GatewayError.authentication("This API key has expired. Ask your administrator for a new one.")
        case .disabledUser: GatewayError.authentication("This user is disabled. Ask your administrator to enable it.")
        case .unknownKey, .ok: GatewayError.authentication("Unknown API key. Check the key, or ask your administrator for a new one.")
        }
    }

    func identity(forKey key: String) async throws -> Identity {
        guard let stored = try await credentials.key(hash: ApiKeyGenerator.hash(key)) else { throw Self.keyError(.unknownKey) }
        // A disabled user's valid key was still used (its last_used_at says so); a revoked or
        // expired one was not.
        if stored.check == .ok || stored.check == .disabledUser { keyUsage?.record(stored.keyID) }
        guard stored.check == .ok else { throw Self.keyError(stored.check) }
        return .user(
            UserIdentity(
                companyID: stored.companyID, userID: stored.userID, role: stored.role, credential: .apiKey, features: stored.features))
    }

    func identity(forJWT token: String) async throws -> Identity {
        guard !jwtKeys.isEmpty else {
            throw GatewayError.authentication("Tokens are not accepted by this gateway: no JWT keys are configured.")
        }
        let header = try Self.checkIJSON(token)
        // The header's alg picks the keys (a token is verified only as the kind it says it is).
        guard let keys = header["alg"]?.stringValue.flatMap({ jwtKeys[$0] }) else {
            throw GatewayError.authentication(
                "The token's alg must be \(jwtKeys.keys.sorted().joined(separator: " or ")), as this gateway verifies it.")
        }
        let payload: ClaimsPayload
        do {
            payload = try await keys.verify(token, as: ClaimsPayload.self, iteratingKeys: true)
        } catch {
            throw GatewayError.authentication("The token's signature or format is not valid.")
        }
        try claimRules.check(payload.claims)
        guard let sub = payload.claims["sub"]?.stringValue, let userID = UUID(uuidString: sub) else {
            throw GatewayError.authentication("The token's sub claim must be the user's UUID.")
        }
        guard let companyText = payload.claims.value(atPath: companyClaim)?.stringValue,
            let companyID = UUID(uuidString: companyText)
        else {
            throw GatewayError.authentication("The token has no company UUID at claim '\(companyClaim)'.")
        }
        let features = try boundFeatures(payload.claims)
        // The user must exist in that company (SPEC: an unknown user or company is 401).
        guard let member = try await credentials.member(company: companyID, user: userID) else {
            throw GatewayError.authentication(
                "The token's user is not known in its company: ask your administrator to add the user to CapGate.")
        }
        if member.disabled { throw GatewayError.authentication("This user is disabled. Ask your administrator to enable it.") }
        return .user(
            UserIdentity(
                companyID: companyID, userID: userID, role: member.role, credential: .jwt,
                features: features))
    }

    /// The features a token is bound to (SPEC §8): the claim at `jwt.featureClaim`, a feature id
    /// or a list of them; nil when the claim is absent (or no claim path is configured). Any
    /// other value is a 401: a binding the gateway cannot read must not leave the token unbound.
    func boundFeatures(_ claims: JSON) throws -> [String]? {
        guard let featureClaim, let value = claims.value(atPath: featureClaim) else { return nil }
        switch value {
        case .string(let one) where CallCost.isFeatureID(one):
            return [one]
        case .array(let many):
            let ids = many.compactMap(\.stringValue).filter(CallCost.isFeatureID)
            if ids.count == many.count { return ids }
        default:
            break
        }
        throw GatewayError.authentication(
            "The token's claim '\(featureClaim)' must be a feature id or a list of feature ids (the features it may be charged to).")
    }
}

extension Authenticator {
    /// A token's header and payload must each be one I-JSON text (SPEC §7): a claim named twice
    /// is read as its first value by some libraries and its last by others, so which company or
    /// user it names would depend on the reader. 401 before the signature is checked.
    /// Checks that the header and payload are I-JSON; returns the header.
    @discardableResult
    static func checkIJSON(_ token: String) throws -> JSON {
        var parts: [JSON] = []
        for part in token.split(separator: ".", omittingEmptySubsequences: false).prefix(2) {
            guard let bytes = Self.base64URLDecoded(part) else {
                throw GatewayError.authentication("The token is not a valid JWT: a part is not base64url.")
            }
            do {
                parts.append(try JSONParser.parse(bytes, maxDepth: 32))
            } catch {
                throw GatewayError.authentication("The token's header or payload is not I-JSON: \(error.reason).")
            }
        }
        return parts.first ?? .null
    }

    static func base64URLDecoded(_ text: Substring) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("=") else { return nil }
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64).map { Array($0) }
    }
}

/// A JWT payload kept whole, so the company claim can sit at any path.
struct ClaimsPayload: JWTPayload {
    var claims: JSON

    init(from decoder: any Decoder) throws {
        claims = try decoder.singleValueContainer().decode(JSON.self)
    }

    func encode(to encoder: any Encoder) throws {
        try claims.encode(to: encoder)
    }

    /// Nothing here: the claims are checked after the signature by ``JWTClaimRules``, which
    /// knows the configured audience, issuer and leeway.
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

extension HTTPField.Name {
    static let xAPIKey = Self("x-api-key")!
    static let idempotencyKey = Self("idempotency-key")!
    static let requestID = Self("request-id")!
    static let rateLimit = Self("RateLimit")!
    static let rateLimitPolicy = Self("RateLimit-Policy")!
    static let anthropicBeta = Self("anthropic-beta")!
}
