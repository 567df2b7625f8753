import CapGate
import Foundation

/// App Store payloads for the tests, signed by ``AppleTestSigner``, and the gateway settings
/// that trust its root.
struct AppleFixture: Sendable {
    static let bundle = "com.example.capgate"
    static let appID: Int64 = 1_234_567_890
    let signer = AppleTestSigner.shared
    /// Now, in whole seconds (Apple's dates are milliseconds; the tests compare seconds).
    let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))

    /// `apple.*` for a gateway that trusts the test root; `environments` as text.
    static func settings(environments: String = "Production,Sandbox") -> [String: String] {
        [
            "apple.bundleId": bundle, "apple.appAppleId": String(appID), "apple.environments": environments,
            "apple.rootCertificates": AppleTestSigner.shared.rootFile,
        ]
    }

    func transactionFields(
        _ id: String, original: String? = nil, product: String = "app.low.monthly", token: UUID?, purchase: Date? = nil,
        expires: Date? = nil, environment: String = "Production", type: String = "Auto-Renewable Subscription", signed: Date? = nil,
        bundle: String? = bundle, revoked: Date? = nil
    ) -> [String: Any] {
        var fields: [String: Any] = [
            "transactionId": id, "originalTransactionId": original ?? id, "productId": product,
            "purchaseDate": AppleTestSigner.millis(purchase ?? now - 60), "environment": environment, "type": type,
            "signedDate": AppleTestSigner.millis(signed ?? now - 30), "quantity": 1, "inAppOwnershipType": "PURCHASED",
        ]
        if type == "Auto-Renewable Subscription" { fields["expiresDate"] = AppleTestSigner.millis(expires ?? now + 86400 * 30) }
        if let token { fields["appAccountToken"] = token.uuidString.lowercased() }
        if let bundle { fields["bundleId"] = bundle }
        if let revoked {
            fields["revocationDate"] = AppleTestSigner.millis(revoked)
            fields["revocationReason"] = 0
        }
        return fields
    }

    func transaction(
        _ id: String, original: String? = nil, product: String = "app.low.monthly", token: UUID?, purchase: Date? = nil,
        expires: Date? = nil, environment: String = "Production", type: String = "Auto-Renewable Subscription", signed: Date? = nil,
        bundle: String? = bundle, revoked: Date? = nil, chain: AppleTestSigner.Chain? = nil
    ) throws -> String {
        try signer.sign(
            transactionFields(
                id, original: original, product: product, token: token, purchase: purchase, expires: expires,
                environment: environment, type: type, signed: signed, bundle: bundle, revoked: revoked),
            chain: chain)
    }

    func renewal(
        original: String, product: String = "app.low.monthly", next: String? = nil, grace: Date? = nil, environment: String = "Production",
        signed: Date? = nil
    ) throws -> String {
        var fields: [String: Any] = [
            "originalTransactionId": original, "productId": product, "autoRenewProductId": next ?? product, "autoRenewStatus": 1,
            "environment": environment, "signedDate": AppleTestSigner.millis(signed ?? now - 30),
        ]
        if let grace { fields["gracePeriodExpiresDate"] = AppleTestSigner.millis(grace) }
        return try signer.sign(fields)
    }

    func notificationFields(
        _ type: String, _ subtype: String? = nil, uuid: String = UUID().uuidString, signed: Date? = nil, transaction: String? = nil,
        renewal: String? = nil, environment: String = "Production", bundle: String? = bundle, appID: Int64? = appID
    ) -> [String: Any] {
        var data: [String: Any] = ["environment": environment, "bundleVersion": "1"]
        if let bundle { data["bundleId"] = bundle }
        if let appID { data["appAppleId"] = appID }
        if let transaction { data["signedTransactionInfo"] = transaction }
        if let renewal { data["signedRenewalInfo"] = renewal }
        var fields: [String: Any] = [
            "notificationType": type, "notificationUUID": uuid, "version": "2.0", "data": data,
            "signedDate": AppleTestSigner.millis(signed ?? now - 20),
        ]
        if let subtype { fields["subtype"] = subtype }
        return fields
    }

    func notification(
        _ type: String, _ subtype: String? = nil, uuid: String = UUID().uuidString, signed: Date? = nil, transaction: String? = nil,
        renewal: String? = nil, environment: String = "Production", bundle: String? = bundle, appID: Int64? = appID,
        chain: AppleTestSigner.Chain? = nil
    ) throws -> String {
        try signer.sign(
            notificationFields(
                type, subtype, uuid: uuid, signed: signed, transaction: transaction, renewal: renewal, environment: environment,
                bundle: bundle, appID: appID),
            chain: chain)
    }

    /// The JWS with its payload replaced by `fields` and its signature kept (a forgery).
    func tampered(_ jws: String, _ fields: [String: Any]) throws -> String {
        let parts = jws.split(separator: ".")
        let data = try JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys])
        return String(parts[0]) + "." + AppleTestSigner.base64URL(data) + "." + String(parts[2])
    }
}

extension Harness {
    /// What the app sets as `appAccountToken` on a purchase for `company`: its purchase token (SPEC §12).
    func appAccountToken(_ company: UUID) async throws -> UUID {
        UUID(uuidString: try await text("SELECT app_account_token FROM companies WHERE id = '\(company.text)'") ?? "")!
    }

    /// `POST /billing/apple/notifications` with `{"signedPayload": jws}`.
    func appleNotification(_ jws: String) async throws -> Reply {
        try await request(.POST, "/billing/apple/notifications", json: .obj(["signedPayload": .string(jws)]))
    }

    /// `POST /v1/billing/apple/transactions` with a client key.
    func appleTransaction(_ jws: String, key: String) async throws -> Reply {
        try await request(
            .POST, "/v1/billing/apple/transactions", headers: [("x-api-key", key)], json: .obj(["signedTransaction": .string(jws)]))
    }

    /// The plan of `company`'s period that contains now, its end (seconds since 1970) and auto-renew.
    func currentPeriod(_ company: UUID) async throws -> (plan: String?, end: Int64, autoRenew: Bool) {
        let condition = "company_id = '\(company.text)' AND started_at <= now() AND ends_at > now()"
        let plan = try await text("SELECT plan_id FROM plan_periods WHERE \(condition)")
        let end = try await scalar("SELECT extract(epoch FROM ends_at) FROM plan_periods WHERE \(condition)")
        let renews = try await scalar("SELECT auto_renew::int FROM plan_periods WHERE \(condition)")
        return (plan, end, renews == 1)
    }
}
