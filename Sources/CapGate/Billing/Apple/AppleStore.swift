import Foundation
import Logging
import PostgresNIO

/// App Store notifications and transactions in PostgreSQL (SPEC §12): each notification stored
/// once by `notificationUUID` and, in the same transaction, applied through
/// ``BillingStore/apply(_:on:now:)`` (the path of `POST /admin/v1/billing/events`).
struct AppleStore: Sendable {
    let billing: BillingStore
    var database: Database { billing.database }
    var logger: Logger { billing.logger }

    /// What became of a notification (or of a posted transaction that was not applied).
    enum Outcome: String, Sendable {
        case applied, stale, kept, stored, unmatched, refused, failed, duplicate
    }

    /// Stores `notification` once and applies what it maps to, unless it is a repeat, signed
    /// before the last one applied for its subscription, of no known company, or kept off its
    /// company's plan by ``verdict(_:_:now:)``.
    func receive(_ notification: AppleNotification, now: Date = Date()) async throws -> Outcome {
        do {
            return try await database.transaction { connection in
                try await receive(notification, on: connection, now: now)
            }
        } catch DatabaseError.constraint(_, let constraint, _)
            where constraint?.contains("pkey") == true || constraint?.contains("transaction_id") == true
        {
            // A concurrent delivery of the same notification (or the first link of its subscription) won.
            return try await receive(notification, now: now)
        }
    }

    func receive(_ notification: AppleNotification, on connection: PostgresConnection, now: Date) async throws -> Outcome {
        let known = try await connection.query(
            "SELECT 1 FROM apple_notifications WHERE notification_uuid = \(notification.uuid)", logger: logger
        ).collect()
        guard known.isEmpty else { return .duplicate }
        let transaction = notification.transaction
        let action = AppleAction.of(type: notification.type, subtype: notification.subtype, oneTime: transaction?.isOneTime == true)
        var company: UUID?
        var outcome = Outcome.stored
        var detail: String?
        if let transaction {
            try await lockSubscription(connection, transaction.originalTransactionId)
            let link = try await self.link(connection, transaction.originalTransactionId)
            switch try await owner(connection, transaction: transaction, linked: link?.company) {
            case .unmatched:
                outcome = .unmatched
            case .refused(let linked, let reason):
                (company, outcome, detail) = (linked, .refused, reason)
            case .company(let id):
                company = id
                if case .store(let stored) = action {
                    outcome = stored == .kept ? .kept : .stored
                } else if let last = link?.lastApplied, notification.signedDate < last {
                    outcome = .stale
                } else if let event = event(action, notification: notification, transaction: transaction, company: id) {
                    (outcome, detail) = try await applyGuarded(connection, event, now: now)
                    if Self.marksOrder(event, outcome) {
                        try await noteApplied(connection, transaction.originalTransactionId, company: id, signed: notification.signedDate)
                    }
                }
            }
        }
        try await store(connection, notification, company: company, outcome: outcome, detail: detail)
        return outcome
    }

    /// Whether `event`, ending as `outcome`, is the latest word on its subscription: applied, or a
    /// refund that found nothing to undo (a purchase signed before it must never apply after it).
    static func marksOrder(_ event: BillingStore.StoreEvent, _ outcome: Outcome) -> Bool {
        outcome == .applied || (event.kind == .refund && outcome == .stored)
    }

    /// Applies a transaction the app posted for `company` at once (purchase, or renewal when the
    /// company already runs the product's plan); the notification for it later finds it applied.
    /// Its `appAccountToken` must be the company's purchase token (else 403), and its subscription
    /// linked to no other company (else 403). A one-time purchase (a top-up, SPEC §12) grants its
    /// pack, once. One Apple has revoked (`revocationDate`) is a refund, never a purchase. One
    /// signed before the last change applied to its subscription (a refund, say) is stored as
    /// `stale`, not applied: a refunded purchase posted late never restores a plan. One that
    /// ``verdict(_:_:now:)`` keeps off the company's plan is stored with the reason.
    func post(_ transaction: AppleTransaction, company: UUID, now: Date = Date()) async throws -> String {
        let kind = Self.postedKind(transaction)
        let event = BillingStore.StoreEvent(
            kind: kind, companyID: company, productID: transaction.productId,
            transactionID: AppleAction.eventKey(kind, transaction: transaction, notification: nil),
            originalTransactionID: transaction.originalTransactionId, purchaseDate: transaction.purchaseDate,
            expirationDate: transaction.expiresDate, payload: Self.jsonValue(["transaction": transaction]),
            topUpOnly: transaction.isOneTime)
        do {
            return try await database.transaction { connection in
                guard let token = transaction.accountToken, try await self.token(of: company, on: connection) == token else {
                    throw GatewayError.permission(
                        "This transaction's appAccountToken is not your company's purchase token (app_account_token in GET /v1/usage).")
                }
                try await lockSubscription(connection, transaction.originalTransactionId)
                let link = try await link(connection, transaction.originalTransactionId)
                if let link, link.company != company {
                    throw GatewayError.permission("This App Store subscription belongs to another company.")
                }
                // The same transaction posted again, or already applied by its notification: its answer.
                if let answer = try await billing.recordedAnswer(connection, event) { return answer }
                if let last = link?.lastApplied, transaction.signedDate < last {
                    let reason = "signed before the last change applied to its subscription (\(Timestamp.format(last)))"
                    return try await notApplied(connection, transaction, company: company, outcome: .stale, reason: reason)
                }
                if let verdict = try await verdict(connection, event, now: now) {
                    if Self.marksOrder(event, verdict.outcome) {
                        try await noteApplied(
                            connection, transaction.originalTransactionId, company: company, signed: transaction.signedDate)
                    }
                    return try await notApplied(connection, transaction, company: company, outcome: verdict.outcome, reason: verdict.reason)
                }
                let answer = try await billing.apply(event, on: connection, now: now)
                try await noteApplied(connection, transaction.originalTransactionId, company: company, signed: transaction.signedDate)
                return answer
            }
        } catch let error as GatewayError {
            throw error
        } catch DatabaseError.constraint(_, let constraint, _) where constraint?.contains("transaction_id") == true {
            return try await post(transaction, company: company, now: now)
        } catch {
            throw BillingStore.gatewayError(error, event: event)
        }
    }

    /// What a posted transaction is: revoked, a refund; a one-time purchase, a purchase (of its
    /// pack); a subscription's first transaction, a purchase; a later one, a renewal.
    static func postedKind(_ transaction: AppleTransaction) -> BillingStore.StoreEvent.Kind {
        if transaction.isRevoked { return .refund }
        if transaction.isOneTime { return .purchase }
        return transaction.transactionId == transaction.originalTransactionId ? .purchase : .renewal
    }

    /// Records that a change signed at `signed` was applied to subscription `original` of
    /// `company` (linking it on its first): later deliveries signed before it are not applied.
    func noteApplied(_ connection: PostgresConnection, _ original: String, company: UUID, signed: Date) async throws {
        try await connection.query(
            """
            INSERT INTO apple_transactions (original_transaction_id, company_id, last_applied_at)
            VALUES (\(original), \(company), \(signed))
            ON CONFLICT (original_transaction_id) DO UPDATE
               SET last_applied_at = GREATEST(apple_transactions.last_applied_at, EXCLUDED.last_applied_at)
            """,
            logger: logger)
    }

    /// Stores a posted transaction that is not applied, for the operator (once per signed copy),
    /// and answers what became of it.
    func notApplied(
        _ connection: PostgresConnection, _ transaction: AppleTransaction, company: UUID, outcome: Outcome, reason: String
    ) async throws -> String {
        let key = "transaction:\(transaction.transactionId.prefix(60)):\(Int64(transaction.signedDateMillis))"
        let payload = Self.json(["transaction": transaction])
        try await connection.query(
            """
            INSERT INTO apple_notifications (notification_uuid, company_id, notification_type, environment, signed_at,
                original_transaction_id, transaction_id, product_id, outcome, detail, payload)
            VALUES (\(key), \(company), \(Self.postedType), \(transaction.environment ?? ""), \(transaction.signedDate),
                \(transaction.originalTransactionId), \(transaction.transactionId), \(transaction.productId), \(outcome.rawValue),
                \(reason), \(payload)::jsonb)
            ON CONFLICT (notification_uuid) DO NOTHING
            """,
            logger: logger)
        logger.info(
            "App Store transaction not applied",
            metadata: ["transaction_id": "\(transaction.transactionId)", "outcome": "\(outcome.rawValue)", "reason": "\(reason)"])
        return JSON.obj([
            "transaction_id": .string(transaction.transactionId), "applied": .bool(false), "outcome": .string(outcome.rawValue),
            "reason": .string(reason),
        ]).serialized()
    }

    /// `notification_type` of a transaction the app posted, stored beside Apple's notifications.
    static let postedType = "TRANSACTION"

    /// The store event of an applied action (nil: nothing to apply).
    func event(
        _ action: AppleAction, notification: AppleNotification, transaction: AppleTransaction, company: UUID
    )
        -> BillingStore.StoreEvent?
    {
        var kind: BillingStore.StoreEvent.Kind
        var expiration = transaction.expiresDate
        switch action {
        case .event(let chosen): kind = chosen
        case .grace:
            kind = .renewal
            expiration = notification.renewal?.gracePeriodExpiresDate ?? transaction.expiresDate
        case .store: return nil
        }
        // What Apple revoked is refunded, whatever the notification's type says (SPEC §12).
        if transaction.isRevoked { kind = .refund }
        return BillingStore.StoreEvent(
            kind: kind, companyID: company, productID: transaction.productId,
            transactionID: AppleAction.eventKey(
                action == .grace ? .expire : kind, transaction: transaction, notification: notification.uuid),
            originalTransactionID: transaction.originalTransactionId, purchaseDate: transaction.purchaseDate,
            expirationDate: expiration,
            payload: .obj(["notification_uuid": .string(notification.uuid), "notification_type": .string(notification.type)]),
            topUpOnly: transaction.isOneTime || notification.type == "ONE_TIME_CHARGE")
    }

    /// Applies `event` under a savepoint unless ``verdict(_:_:now:)`` keeps it off the company's
    /// plan (`refused` or `stored`, with the reason); a failure (an unmapped product) is stored as
    /// `failed` with its reason, for the operator, and the notification is still kept. An event
    /// already recorded (the app posted it first) is `applied`, and changes nothing.
    func applyGuarded(
        _ connection: PostgresConnection, _ event: BillingStore.StoreEvent, now: Date
    ) async throws -> (
        Outcome, String?
    ) {
        try await connection.query("SAVEPOINT apple_apply", logger: logger)
        do {
            var result: (Outcome, String?) = (.applied, nil)
            if try await billing.recordedAnswer(connection, event) == nil, let verdict = try await verdict(connection, event, now: now) {
                result = (verdict.outcome, verdict.reason)
            } else {
                _ = try await billing.apply(event, on: connection, now: now)
            }
            try await connection.query("RELEASE SAVEPOINT apple_apply", logger: logger)
            return result
        } catch {
            // A lost connection, or a concurrent delivery's unique row: the whole transaction goes.
            if let psql = error as? PSQLError, psql.serverInfo == nil || psql.serverInfo?[.sqlState] == "23505" { throw error }
            try await connection.query("ROLLBACK TO SAVEPOINT apple_apply", logger: logger)
            let mapped = BillingStore.gatewayError(error, event: event)
            let reason = (mapped as? GatewayError).map { $0.message } ?? String(describing: mapped)
            logger.warning("App Store notification not applied", metadata: ["reason": "\(reason)"])
            return (.failed, reason)
        }
    }

    /// One subscription's notifications are applied one at a time.
    func lockSubscription(_ connection: PostgresConnection, _ original: String) async throws {
        try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended('apple:' || \(original), 0))", logger: logger)
    }

    func link(_ connection: PostgresConnection, _ original: String) async throws -> (company: UUID, lastApplied: Date?)? {
        try await connection.query(
            "SELECT company_id, last_applied_at FROM apple_transactions WHERE original_transaction_id = \(original)", logger: logger
        ).decode((UUID, Date?).self).collect().first.map { (company: $0.0, lastApplied: $0.1) }
    }

    func store(
        _ connection: PostgresConnection, _ notification: AppleNotification, company: UUID?, outcome: Outcome, detail: String?
    ) async throws {
        let payload = Self.json(
            [
                "notification": notification.payload, "transaction": notification.transaction, "renewal": notification.renewal,
            ] as [String: (any Encodable)?])
        let transaction = notification.transaction
        try await connection.query(
            """
            INSERT INTO apple_notifications (notification_uuid, company_id, notification_type, subtype, environment, signed_at,
                original_transaction_id, transaction_id, product_id, outcome, detail, payload)
            VALUES (\(notification.uuid), \(company), \(notification.type), \(notification.subtype), \(notification.environment),
                \(notification.signedDate), \(transaction?.originalTransactionId), \(transaction?.transactionId),
                \(transaction?.productId), \(outcome.rawValue), \(detail), \(payload)::jsonb)
            """,
            logger: logger)
    }

    /// What the operator sorts out, newest first (`GET /admin/v1/billing/apple/unmatched`): the
    /// notifications that matched no company, and the store purchases stored without being applied
    /// (`refused`: a company on the operator's plan, a subscription linked to another company),
    /// each with its `reason`.
    func unmatched(limit: Int = 200) async throws -> [JSON] {
        let rows = try await database.run { client in
            try await client.query(
                """
                SELECT notification_uuid, notification_type, subtype, environment, signed_at, original_transaction_id,
                       transaction_id, product_id, received_at, outcome, company_id, detail
                  FROM apple_notifications WHERE outcome IN ('unmatched', 'refused')
                 ORDER BY received_at DESC LIMIT \(limit)
                """,
                logger: logger
            ).decode(UnmatchedRow.self).collect()
        }
        return rows.map(Self.unmatchedJSON)
    }

    typealias UnmatchedRow = (String, String, String?, String, Date, String?, String?, String?, Date, String, UUID?, String?)

    static func unmatchedJSON(_ row: UnmatchedRow) -> JSON {
        let fields: [JSON.Field] = [
            .init("notification_uuid", .string(row.0)), .init("notification_type", .string(row.1)), .init("subtype", JSON(row.2)),
            .init("environment", .string(row.3)), .init("signed_date", JSON(row.4)), .init("original_transaction_id", JSON(row.5)),
            .init("transaction_id", JSON(row.6)), .init("product_id", JSON(row.7)), .init("received_at", JSON(row.8)),
            .init("outcome", .string(row.9)), .init("company_id", JSON(row.10)), .init("reason", JSON(row.11)),
        ]
        return .object(fields)
    }

    /// ``json(_:)`` as a ``JSON`` value.
    static func jsonValue(_ fields: [String: (any Encodable)?]) -> JSON {
        (try? JSON.parse(Array(json(fields).utf8))) ?? .obj([:])
    }

    /// Codable values as one JSON text (the stored payloads).
    static func json(_ fields: [String: (any Encodable)?]) -> String {
        struct Wrapped: Encodable {
            let fields: [String: (any Encodable)?]
            func encode(to encoder: any Encoder) throws {
                var container = encoder.container(keyedBy: Key.self)
                for (key, value) in fields.sorted(by: { $0.key < $1.key }) {
                    if let value { try container.encode(value, forKey: Key(key)) } else { try container.encodeNil(forKey: Key(key)) }
                }
            }
        }
        struct Key: CodingKey {
            var stringValue: String
            var intValue: Int? { nil }
            init(_ text: String) { stringValue = text }
            init?(stringValue: String) { self.stringValue = stringValue }
            init?(intValue: Int) { nil }
        }
        let data = (try? JSONEncoder().encode(Wrapped(fields: fields))) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }
}
