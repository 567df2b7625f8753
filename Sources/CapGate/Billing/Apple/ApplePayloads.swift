import Foundation
import JWTKit

/// A verified App Store Server Notification V2 with its verified nested data.
struct AppleNotification: Sendable {
    /// The notification's own JWS payload (`responseBodyV2DecodedPayload`).
    struct Payload: ValidationTimePayload {
        var notificationType: String
        var subtype: String?
        var notificationUUID: String
        var version: String?
        var signedDateMillis: Double
        var data: Scope?
        var summary: Scope?

        var signedDate: Date { Date(timeIntervalSince1970: signedDateMillis / 1000) }

        enum CodingKeys: String, CodingKey {
            case notificationType, subtype, notificationUUID, version, data, summary
            case signedDateMillis = "signedDate"
        }

        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    /// `data` (or `summary`): which app and environment, and the nested signed data.
    struct Scope: Codable, Sendable {
        var appAppleId: Int64?
        var bundleId: String?
        var environment: String?
        var signedTransactionInfo: String?
        var signedRenewalInfo: String?
    }

    var payload: Payload
    var environment: String
    var transaction: AppleTransaction?
    var renewal: AppleRenewalInfo?

    var type: String { payload.notificationType }
    var subtype: String? { payload.subtype }
    var uuid: String { payload.notificationUUID }
    var signedDate: Date { payload.signedDate }
}

/// A verified App Store transaction (`JWSTransactionDecodedPayload`): the fields CapGate reads.
struct AppleTransaction: ValidationTimePayload {
    var transactionId: String
    var originalTransactionId: String
    var bundleId: String?
    var productId: String?
    var purchaseDateMillis: Double?
    var expiresDateMillis: Double?
    var revocationDateMillis: Double?
    var appAccountToken: String?
    var environment: String?
    /// `Auto-Renewable Subscription`, `Non-Consumable`, `Consumable`, `Non-Renewing Subscription`.
    var type: String?
    var signedDateMillis: Double

    var signedDate: Date { Date(timeIntervalSince1970: signedDateMillis / 1000) }
    var purchaseDate: Date? { purchaseDateMillis.map { Date(timeIntervalSince1970: $0 / 1000) } }
    var expiresDate: Date? { expiresDateMillis.map { Date(timeIntervalSince1970: $0 / 1000) } }
    /// The company the app named at purchase (`appAccountToken`), when it is a UUID.
    var accountToken: UUID? { appAccountToken.flatMap { UUID(uuidString: $0) } }
    /// A consumable or non-consumable: a top-up, not a subscription.
    var isOneTime: Bool { type == "Consumable" || type == "Non-Consumable" }
    /// Apple refunded or revoked it (`revocationDate`): a refund, never a purchase (SPEC §12).
    var isRevoked: Bool { revocationDateMillis != nil }

    enum CodingKeys: String, CodingKey {
        case transactionId, originalTransactionId, bundleId, productId, appAccountToken, environment, type
        case purchaseDateMillis = "purchaseDate", expiresDateMillis = "expiresDate", revocationDateMillis = "revocationDate"
        case signedDateMillis = "signedDate"
    }

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Verified renewal info (`JWSRenewalInfoDecodedPayload`): the fields CapGate reads.
struct AppleRenewalInfo: ValidationTimePayload {
    var originalTransactionId: String?
    /// Not in Apple's renewal info; checked against `apple.bundleId` if it ever is.
    var bundleId: String?
    var autoRenewProductId: String?
    var productId: String?
    var gracePeriodExpiresDateMillis: Double?
    var environment: String?
    var signedDateMillis: Double

    var signedDate: Date { Date(timeIntervalSince1970: signedDateMillis / 1000) }
    var gracePeriodExpiresDate: Date? { gracePeriodExpiresDateMillis.map { Date(timeIntervalSince1970: $0 / 1000) } }

    enum CodingKeys: String, CodingKey {
        case originalTransactionId, bundleId, autoRenewProductId, productId, environment
        case gracePeriodExpiresDateMillis = "gracePeriodExpiresDate", signedDateMillis = "signedDate"
    }

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}
