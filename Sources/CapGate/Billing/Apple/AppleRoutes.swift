import Foundation
import Hummingbird
import Logging

/// The App Store's routes (SPEC §12): Apple's signed notifications, the app's signed
/// transactions, and the operator's list of notifications that matched no company.
struct AppleRoutes {
    let signed: AppleSignedData
    let store: AppleStore

    /// The largest signed payload read (Apple's are a few KiB: three certificates and the claims).
    static let maxJWSLength = 64 << 10

    /// `POST /billing/apple/notifications`: no CapGate credential; trust comes from the signature.
    func registerNotifications(on router: Router<GatewayContext>) {
        router.post("/billing/apple/notifications") { request, context in
            let fields = try await BodyFields.read(request, context: context)
            let jws = try fields.requiredString("signedPayload", maxLength: Self.maxJWSLength)
            let notification = try await verified(context.logger, "notification") { try await signed.notification(jws) }
            let outcome = try await store.receive(notification)
            context.logger.info(
                "App Store notification",
                metadata: [
                    "notification_uuid": "\(notification.uuid)", "type": "\(notification.type)",
                    "subtype": "\(notification.subtype ?? "")", "outcome": "\(outcome.rawValue)",
                ])
            return jsonResponse(.obj(["notification_uuid": .string(notification.uuid), "outcome": .string(outcome.rawValue)]))
        }
    }

    /// `POST /v1/billing/apple/transactions`: a member's or admin's credential; the transaction's
    /// `appAccountToken` must be the caller's company's purchase token (``AppleStore/post(_:company:now:)``).
    func registerTransactions(on group: RouterGroup<AuthenticatedContext>) {
        group.post("billing/apple/transactions") { request, context in
            guard let user = context.identity.user else {
                throw GatewayError.permission("Only a company's member or admin posts its App Store transactions.")
            }
            let fields = try await BodyFields.read(request, context: context)
            let jws = try fields.requiredString("signedTransaction", maxLength: Self.maxJWSLength)
            let transaction = try await verified(context.logger, "transaction") { try await signed.transaction(jws) }
            let answer = try await store.post(transaction, company: user.companyID)
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: answer)))
        }
    }

    /// `GET /admin/v1/billing/apple/unmatched` and `POST /admin/v1/companies/{id}/app-account-token` (operator).
    func registerAdmin(on group: RouterGroup<AuthenticatedContext>) {
        group.get("billing/apple/unmatched") { _, context in
            try context.requireOperator()
            return jsonResponse(.obj(["data": .array(try await store.unmatched())]))
        }
        group.post("companies/{id}/app-account-token") { _, context in
            try context.requireOperator()
            let id = try context.parameters.uuid("id", what: "company")
            guard let token = try await store.rotateToken(company: id, by: context.auditActor) else {
                throw GatewayError.notFound("No company with that id.")
            }
            return jsonResponse(.obj(["company_id": JSON(id), "app_account_token": JSON(token)]), status: .created)
        }
    }

    /// Runs a verification; a refusal is logged with its reason (never the payload) and is 400.
    func verified<T>(_ logger: Logger, _ what: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let refusal as AppleSignedData.Refusal {
            logger.warning("App Store \(what) refused", metadata: ["reason": "\(refusal.reason.prefix(2000))"])
            throw GatewayError.invalidRequest("The App Store \(what) did not verify: \(refusal.message).")
        }
    }
}
