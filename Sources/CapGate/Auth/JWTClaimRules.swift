import Foundation

/// The registered claims a verified token must satisfy (its signature is checked first):
/// `exp` is required and not past, `nbf` (if present) not in the future, both with
/// `jwt.leeway` seconds of clock skew (default none: SPEC §3, an expired JWT is 401); `aud` must contain `jwt.audience` and `iss` must equal
/// `jwt.issuer` when those are configured. A failure is a 401 that says which claim.
struct JWTClaimRules: Sendable {
    var audience: String?
    var issuer: String?
    var leeway: TimeInterval
    /// `jwt.maxLifetime`: the longest `exp - iat` (or `exp - now` without `iat`) accepted.
    var maxLifetime: TimeInterval?

    init(audience: String? = nil, issuer: String? = nil, leeway: TimeInterval = 0, maxLifetime: TimeInterval? = nil) {
        self.audience = audience
        self.issuer = issuer
        self.leeway = leeway
        self.maxLifetime = maxLifetime
    }

    init(configuration: CapGateConfiguration) {
        self.init(
            audience: configuration.jwt.audience, issuer: configuration.jwt.issuer, leeway: TimeInterval(configuration.jwt.leeway),
            maxLifetime: configuration.jwt.maxLifetime.map(TimeInterval.init))
    }

    /// Throws a 401 ``GatewayError`` for the first claim that fails.
    func check(_ claims: JSON, now: Date = Date()) throws(GatewayError) {
        let time = now.timeIntervalSince1970
        guard let exp = claims["exp"]?.doubleValue else {
            throw GatewayError.authentication("The token has no exp claim; CapGate accepts only tokens that expire.")
        }
        if time >= exp + leeway {
            throw GatewayError.authentication("The token has expired. Sign in again.")
        }
        if let maxLifetime {
            let issued: Double
            if let iat = claims["iat"] {
                guard let value = iat.doubleValue else {
                    throw GatewayError.authentication("The token's iat claim must be a number of seconds.")
                }
                issued = value
            } else {
                issued = time
            }
            if exp - issued > maxLifetime + leeway {
                throw GatewayError.authentication(
                    "The token lives longer than this gateway accepts (\(Int(maxLifetime)) seconds from iat to exp). Request a shorter-lived token."
                )
            }
        }
        if let nbf = claims["nbf"] {
            guard let notBefore = nbf.doubleValue else {
                throw GatewayError.authentication("The token's nbf claim must be a number of seconds.")
            }
            if time + leeway < notBefore {
                throw GatewayError.authentication("The token is not valid yet (its nbf claim is in the future).")
            }
        }
        if let issuer, claims["iss"]?.stringValue != issuer {
            throw GatewayError.authentication(
                "The token's issuer (iss) is not '\(issuer)', the issuer this gateway accepts. Use a token from that identity provider.")
        }
        if let audience {
            let values: [String]
            switch claims["aud"] {
            case .string(let one)?: values = [one]
            case .array(let many)?: values = many.compactMap(\.stringValue)
            default: values = []
            }
            guard values.contains(audience) else {
                throw GatewayError.authentication(
                    "The token's audience (aud) does not include '\(audience)', the audience this gateway accepts. "
                        + "Request a token for that audience.")
            }
        }
    }
}
