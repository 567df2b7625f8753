import Foundation
import Hummingbird
import Logging

/// `POST /admin/v1/billing/events` (operator): store events, idempotent by `transaction_id`.
struct BillingRoutes {
    let billing: BillingStore

    func register(on group: RouterGroup<AuthenticatedContext>) {
        group.post("billing/events") { request, context in
            try context.requireOperator()
            let fields = try await BodyFields.read(request, context: context)
            let typeText = try fields.requiredString("type", maxLength: 20)
            guard let kind = BillingStore.StoreEvent.Kind(rawValue: typeText), BillingStore.StoreEvent.Kind.posted.contains(kind) else {
                let names = BillingStore.StoreEvent.Kind.posted.map(\.rawValue).joined(separator: ", ")
                throw GatewayError.invalidRequest("'type' must be one of: \(names).")
            }
            let event = BillingStore.StoreEvent(
                kind: kind,
                companyID: try fields.uuid("company_id", required: true)!,
                productID: try fields.string("product_id"),
                transactionID: try fields.requiredString("transaction_id"),
                originalTransactionID: try fields.string("original_transaction_id"),
                purchaseDate: try fields.date("purchase_date"),
                expirationDate: try fields.date("expiration_date"),
                // Kept whole as jsonb, which cannot hold NUL: in fields CapGate does not read (those
                // it reads refuse it) a NUL is kept as U+FFFD.
                payload: .object(fields.fields.sorted { $0.key < $1.key }.map { JSON.Field($0.key, $0.value) })
                    .replacingNUL(when: fields.containsNUL)
            )
            let text = try await billing.apply(event, by: context.auditActor)
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            // 201 for the first delivery and for every repeat: the same answer each time.
            return Response(status: .created, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
        }
    }
}

extension BillingStore {
    /// The rollover every `billing.rolloverInterval` seconds inside `serve`. With several gateway
    /// processes only the one holding the advisory lock acts; the others skip that round.
    func rolloverJob(interval: Duration, logger: Logger) -> PeriodicJob {
        PeriodicJob(interval: interval) {
            do {
                let summary = try await rollover(at: Date(), dryRun: false, wait: false)
                if summary.moved > 0 || summary.withoutPlan > 0 || !summary.partitionsMade.isEmpty || summary.partitionsFailure != nil {
                    logger.info("scheduled rollover", metadata: ["summary": "\(summary)"])
                }
            } catch {
                logger.error("scheduled rollover failed", metadata: ["error": "\(String(describing: error))"])
            }
        }
    }
}
