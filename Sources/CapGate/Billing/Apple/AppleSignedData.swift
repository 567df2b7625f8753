import Foundation
import JWTKit
import Logging
import SwiftASN1
import X509

/// Verifies App Store signed data (SPEC §12) as Apple's App Store Server Library does: ES256
/// over the compact JWS, an `x5c` chain of exactly leaf, intermediate and root that verifies to
/// a configured root with every certificate valid at the payload's `signedDate`, Apple's leaf
/// and intermediate OIDs, then the bundle id, the environment and (in Production) the app id.
/// The chain and the signature are jwt-kit's `X5CVerifier` over swift-certificates.
struct AppleSignedData: Sendable {
    let settings: AppleSettings
    let verifier: X5CVerifier

    /// With a `logger`, what the settings risk is told once, at start: `Sandbox` accepted beside
    /// `Production` (Sandbox purchases are free to testers) is a warning.
    init(settings: AppleSettings, logger: Logger? = nil) throws {
        self.settings = settings
        self.verifier = try X5CVerifier(rootCertificates: settings.rootCertificates)
        if let warning = settings.sandboxWarning { logger?.warning("\(warning)") }
    }

    /// Why signed data was refused: the reason is logged, never the payload; the caller gets
    /// `message` (the reason itself when it is CapGate's own words, a sentence when it is a
    /// library's: its text can hold a whole certificate chain).
    struct Refusal: Error, CustomStringConvertible {
        var reason: String
        var message: String
        init(_ reason: String, message: String? = nil) {
            self.reason = reason
            self.message = message ?? reason
        }
        var description: String { reason }
    }

    /// A notification with its nested transaction and renewal info, each verified.
    func notification(_ jws: String) async throws -> AppleNotification {
        let payload = try await verify(jws, as: AppleNotification.Payload.self, what: "signedPayload")
        guard let scope = payload.data ?? payload.summary else {
            throw Refusal("the notification has neither data nor summary")
        }
        try check(bundleID: scope.bundleId, environment: scope.environment, appAppleID: scope.appAppleId, what: .notification)
        var transaction: AppleTransaction?
        if let signed = scope.signedTransactionInfo {
            transaction = try await self.transaction(signed, what: "signedTransactionInfo")
            guard transaction?.environment == scope.environment else {
                throw Refusal("signedTransactionInfo is of another environment than the notification")
            }
        }
        var renewal: AppleRenewalInfo?
        if let signed = scope.signedRenewalInfo {
            let info = try await verify(signed, as: AppleRenewalInfo.self, what: "signedRenewalInfo")
            try check(bundleID: info.bundleId, environment: info.environment, appAppleID: nil, what: .renewalInfo)
            guard info.environment == scope.environment else {
                throw Refusal("signedRenewalInfo is of another environment than the notification")
            }
            renewal = info
        }
        return AppleNotification(payload: payload, environment: scope.environment ?? "", transaction: transaction, renewal: renewal)
    }

    /// A transaction (StoreKit 2's `jwsRepresentation`, or a notification's `signedTransactionInfo`).
    func transaction(_ jws: String, what: String = "signedTransaction") async throws -> AppleTransaction {
        let transaction = try await verify(jws, as: AppleTransaction.self, what: what)
        try check(bundleID: transaction.bundleId, environment: transaction.environment, appAppleID: nil, what: .transaction(what))
        return transaction
    }

    /// Which signed data ``check(bundleID:environment:appAppleID:what:)`` reads.
    enum Checked {
        case notification, transaction(String), renewalInfo

        var name: String {
            switch self {
            case .notification: "notification"
            case .transaction(let what): what
            case .renewalInfo: "signedRenewalInfo"
            }
        }
    }

    /// `environment` must be one of `apple.environments`; `bundleID` must be `apple.bundleId`, and
    /// a notification's `data` and every transaction must carry it (Apple's library refuses
    /// either without it: `INVALID_APP_IDENTIFIER`). Renewal info has no `bundleId` in Apple's
    /// `JWSRenewalInfoDecodedPayload` and Apple's library does not read one: it is checked when
    /// present. In Production a notification's `appAppleID` must be `apple.appAppleId`.
    func check(bundleID: String?, environment: String?, appAppleID: Int64?, what: Checked) throws {
        guard let environment, settings.environments.contains(environment) else {
            throw Refusal("\(what.name): environment \(environment ?? "(none)") is not one of apple.environments")
        }
        if case .renewalInfo = what, bundleID == nil {
            // Nothing to compare: Apple's renewal info names no bundle.
        } else {
            guard let configured = settings.bundleID else { throw Refusal("apple.bundleId is not configured") }
            guard let bundleID else { throw Refusal("\(what.name) has no bundleId") }
            guard bundleID == configured else { throw Refusal("\(what.name): bundleId \(bundleID.prefix(200)) is not apple.bundleId") }
        }
        if case .notification = what, environment == "Production" {
            guard let configured = settings.appAppleID else { throw Refusal("apple.appAppleId is not configured (Production)") }
            guard appAppleID == configured else { throw Refusal("notification: appAppleId is not apple.appAppleId") }
        }
    }

    /// The signature and the chain at the payload's `signedDate`, then the payload decoded.
    func verify<Payload: ValidationTimePayload>(_ jws: String, as type: Payload.Type, what: String) async throws -> Payload {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Self.base64URL(parts[0]),
            let header = try? JSONDecoder().decode(Header.self, from: headerData)
        else { throw Refusal("\(what) is not a compact JWS") }
        guard header.alg == "ES256" else { throw Refusal("\(what) is signed with \(header.alg?.prefix(16) ?? "(none)"), not ES256") }
        guard header.x5c?.count == 3 else { throw Refusal("\(what)'s x5c is not leaf, intermediate and root") }
        // One reading of what is applied (as for every body CapGate reads): a payload with a repeated
        // member name could be read one way here and another by Apple's own libraries.
        guard let payload = Self.base64URL(parts[1]), (try? JSONParser.parse(Array(payload), maxDepth: 64)) != nil else {
            throw Refusal("\(what)'s payload is not one I-JSON text (a repeated member name, or not JSON)")
        }
        do {
            return try await verifier.verifyJWS(
                Array(jws.utf8), as: Payload.self, jsonDecoder: JSONDecoder(), validationTime: .signedDate,
                policy: { AppleChainPolicy() })
        } catch let error as JWTError {
            throw Refusal("\(what): \(error.reason ?? String(describing: error.errorType))", message: Self.notVerified(what))
        } catch {
            throw Refusal("\(what): \(error)", message: Self.notVerified(what))
        }
    }

    /// What the caller reads when the signature or the chain failed (the details are logged).
    static func notVerified(_ what: String) -> String {
        "\(what): its signature or its certificate chain does not verify to apple.rootCertificates at its signedDate"
    }

    struct Header: Decodable {
        var alg: String?
        var x5c: [String]?
    }

    static func base64URL(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}

/// Apple's chain: leaf, intermediate, root; the leaf with the App Store receipt-signing OID, the
/// intermediate with Apple's WWDR intermediate OID.
struct AppleChainPolicy: VerifierPolicy {
    static let leafOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 11, 1]
    static let intermediateOID: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 1]

    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) async -> PolicyEvaluationResult {
        guard chain.count == 3 else { return .failsToMeetPolicy(reason: "the chain is not leaf, intermediate and root") }
        guard chain[0].extensions[oid: Self.leafOID] != nil else {
            return .failsToMeetPolicy(reason: "the leaf certificate lacks OID 1.2.840.113635.100.6.11.1")
        }
        guard chain[1].extensions[oid: Self.intermediateOID] != nil else {
            return .failsToMeetPolicy(reason: "the intermediate certificate lacks OID 1.2.840.113635.100.6.2.1")
        }
        return .meetsPolicy
    }
}
