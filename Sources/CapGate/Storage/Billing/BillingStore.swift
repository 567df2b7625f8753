import Foundation
import Logging
import PostgresNIO

/// Store events (purchase, renewal, cancel, refund, expire, restore), the monthly rollover and
/// the ledger verification, all in PostgreSQL.
public struct BillingStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// A store event as posted to `POST /admin/v1/billing/events`.
    public struct StoreEvent: Sendable {
        public enum Kind: String, Sendable, CaseIterable {
            case purchase, renewal, cancel, refund, expire, restore
            /// Auto-renew on again (the App Store's `AUTO_RENEW_ENABLED`, SPEC §12); not a §5 type.
            case resume

            /// The types `POST /admin/v1/billing/events` takes (SPEC §5).
            public static let posted: [Kind] = [.purchase, .renewal, .cancel, .refund, .expire, .restore]
        }
        public var kind: Kind
        public var companyID: UUID
        public var productID: String?
        public var transactionID: String
        public var originalTransactionID: String?
        public var purchaseDate: Date?
        public var expirationDate: Date?
        public var payload: JSON
        /// The event comes from a one-time purchase (an App Store consumable, SPEC §12): it applies
        /// to a top-up product only, never to a subscription's plan.
        public var topUpOnly: Bool

        public init(
            kind: Kind, companyID: UUID, productID: String?, transactionID: String, originalTransactionID: String? = nil,
            purchaseDate: Date? = nil, expirationDate: Date? = nil, payload: JSON = .obj([:]), topUpOnly: Bool = false
        ) {
            self.kind = kind
            self.companyID = companyID
            self.productID = productID
            self.transactionID = transactionID
            self.originalTransactionID = originalTransactionID
            self.purchaseDate = purchaseDate
            self.expirationDate = expirationDate
            self.payload = payload
            self.topUpOnly = topUpOnly
        }
    }

    enum BillingError: Error {
        case unknownProduct(String)
        case productRequired
        case noPeriod
        case badDates
        case transactionOfAnotherCompany
        case notTopUp(String)
        case originalTransactionRequired
    }

    /// Records and applies a store event once per `transaction_id`; a repeat gets the first answer.
    /// Returns the answer's JSON text (a repeat gets the stored text, byte for byte).
    /// With an `actor`, the first application is audited as `billing_event.apply` (a repeat
    /// changes nothing and writes no audit row).
    public func apply(_ event: StoreEvent, now: Date = Date(), by actor: AuditActor? = nil) async throws -> String {
        do {
            return try await database.audited(actor) { connection in
                try await PeriodStore.lockCompany(connection, logger: logger, company: event.companyID)
                if let answer = try await recordedAnswer(connection, event) { return (answer, nil) }
                let before = try await AuditLog.snapshot(AuditLog.period(event.companyID), on: connection, logger: logger)
                let answer = try await apply(event, on: connection, now: now)
                let after = try await AuditLog.snapshot(AuditLog.period(event.companyID), on: connection, logger: logger)
                return (
                    answer,
                    AuditEntry(
                        action: "billing_event.apply", companyID: event.companyID, targetID: event.transactionID, before: before,
                        after: after)
                )
            }
        } catch DatabaseError.constraint(_, let constraint, _) where constraint?.contains("transaction_id") == true {
            // A concurrent delivery of the same event won the race: answer with its result.
            return try await apply(event, now: now, by: actor)
        } catch {
            throw Self.gatewayError(error, event: event)
        }
    }

    /// ``apply(_:now:)`` inside a transaction the caller holds (the App Store notifications store
    /// theirs in the same one); throws the store's own errors (``gatewayError(_:event:)`` maps them).
    func apply(_ event: StoreEvent, on connection: PostgresConnection, now: Date) async throws -> String {
        try await PeriodStore.lockCompany(connection, logger: logger, company: event.companyID)
        if let answer = try await recordedAnswer(connection, event) { return answer }
        let product = try await product(connection, event.productID)
        if let product, product.kind == .topup {
            let grant = try await applyTopUp(connection, event, product: product, now: now)
            return try await record(connection, event, planID: nil, now: now, grant: grant)
        }
        if event.topUpOnly { throw BillingError.notTopUp(event.productID ?? "") }
        let (planID, interval) = (product?.planID, product?.interval ?? .month)
        try await change(connection, event, planID: planID, interval: interval, now: now)
        return try await record(connection, event, planID: planID, now: now)
    }

    /// The answer a caller can act on for an error of ``apply(_:on:now:)``; others as they are.
    static func gatewayError(_ error: any Error, event: StoreEvent) -> any Error {
        do {
            throw error
        } catch BillingError.unknownProduct(let product) {
            return GatewayError.notFound("Unknown product '\(product)': map it to a plan with POST /admin/v1/products first.")
        } catch BillingError.productRequired {
            return GatewayError.invalidRequest("'product_id' is required for \(event.kind.rawValue) events.")
        } catch BillingError.notTopUp(let product) {
            return GatewayError.invalidRequest(
                "Product '\(product)' is not a top-up (kind 'topup'): a one-time purchase never changes a company's plan.")
        } catch BillingError.originalTransactionRequired {
            return GatewayError.invalidRequest(
                "'original_transaction_id' (the top-up purchase's transaction) is required for \(event.kind.rawValue) events of a top-up product."
            )
        } catch BillingError.transactionOfAnotherCompany {
            return GatewayError.conflict("This transaction_id was already recorded for another company.")
        } catch PeriodStore.PeriodError.unknownPlan {
            return GatewayError.notFound("The product's plan no longer exists.")
        } catch BillingError.badDates {
            return GatewayError.invalidRequest("'expiration_date' must be after 'purchase_date'.")
        } catch PeriodStore.PeriodError.unknownCompany {
            return GatewayError.notFound("No company with that id.")
        } catch PeriodStore.PeriodError.periodHasUsage {
            return GatewayError.conflict("A period that starts after now already has usage; check the server's clock.")
        } catch PeriodStore.PeriodError.endsBeforeItBegins {
            return GatewayError.conflict("Calls were counted after purchase_date, so the new period would begin now, after it ends.")
        } catch {
            return error
        }
    }

    /// The answer of an event already recorded under its `transaction_id` (nil: a new one).
    func recordedAnswer(_ connection: PostgresConnection, _ event: StoreEvent) async throws -> String? {
        let previous = try await connection.query(
            "SELECT company_id, result FROM billing_events WHERE transaction_id = \(event.transactionID)", logger: logger
        ).decode((UUID?, String?).self).collect()
        guard let (storedCompany, stored) = previous.first else { return nil }
        guard storedCompany == event.companyID else { throw BillingError.transactionOfAnotherCompany }
        return stored ?? JSON.obj(["transaction_id": .string(event.transactionID), "applied": .bool(true)]).serialized()
    }

    /// What the event does to the company's periods.
    func change(
        _ connection: PostgresConnection, _ event: StoreEvent, planID: String?, interval: PeriodMath.Interval, now: Date
    ) async throws {
        let months = interval == .month ? 1 : 12
        switch event.kind {
        case .purchase, .restore:
            guard let planID else { throw BillingError.productRequired }
            let start = event.purchaseDate ?? now
            let end = event.expirationDate ?? PeriodMath.add(months: months, to: start)
            guard end > start else { throw BillingError.badDates }
            try await PeriodStore.startPeriod(
                connection, logger: logger, company: event.companyID, plan: planID, start: start, end: end,
                interval: interval, autoRenew: true, source: event.kind.rawValue, origin: .store,
                subscription: event.originalTransactionID, now: now
            )
        case .renewal:
            guard let planID else { throw BillingError.productRequired }
            let latest = try await Self.latestPeriod(connection, logger: logger, company: event.companyID)
            if let latest, latest.planID == planID {
                let end = event.expirationDate ?? PeriodMath.add(months: months, to: latest.endsAt)
                guard end > latest.endsAt else { return }
                try await connection.query(
                    """
                    UPDATE plan_periods SET ends_at = \(end), auto_renew = true, status = 'active'
                     WHERE company_id = \(event.companyID) AND id = \(latest.id)
                    """,
                    logger: logger
                )
            } else {
                let start = latest?.endsAt ?? event.purchaseDate ?? now
                let end = event.expirationDate ?? PeriodMath.add(months: months, to: start)
                guard end > start else { throw BillingError.badDates }
                try await PeriodStore.startPeriod(
                    connection, logger: logger, company: event.companyID, plan: planID, start: start, end: end,
                    interval: interval, autoRenew: true, source: "renewal", origin: .store, subscription: event.originalTransactionID,
                    now: now
                )
            }
        case .cancel:
            try await connection.query(
                """
                UPDATE plan_periods SET auto_renew = false, status = 'cancelled'
                 WHERE company_id = \(event.companyID) AND ends_at > \(now)
                """,
                logger: logger
            )
        case .resume:
            try await connection.query(
                """
                UPDATE plan_periods SET auto_renew = true, status = 'active'
                 WHERE company_id = \(event.companyID) AND ends_at > \(now) AND status = 'cancelled'
                """,
                logger: logger
            )
        case .refund, .expire:
            try await Self.moveToDefault(connection, logger: logger, company: event.companyID, at: now, source: event.kind.rawValue)
        }
    }

    /// Records the event with its answer (the company as it now stands), which a repeat gets.
    /// A top-up's event answers with its `grant` too.
    func record(
        _ connection: PostgresConnection, _ event: StoreEvent, planID: String?, now: Date, grant: JSON? = nil
    ) async throws -> String {
        let company = try await Self.companyState(connection, logger: logger, company: event.companyID, at: now)
        var result: JSON = .obj([
            "transaction_id": .string(event.transactionID), "type": .string(event.kind.rawValue),
            "applied": .bool(true), "company": company,
        ])
        if let grant, case .object(var fields) = result {
            fields.append(.init("grant", grant))
            result = .object(fields)
        }
        let inserted = try await connection.query(
            """
            INSERT INTO billing_events (company_id, type, transaction_id, product_id, plan_id, payload, result)
            VALUES (\(event.companyID), \(event.kind.rawValue), \(event.transactionID), \(event.productID), \(planID),
                    \(event.payload.serialized())::jsonb, \(result.serialized()))
            RETURNING id
            """,
            logger: logger
        ).decode(Int64.self).collect()
        if case .object(var fields) = result {
            fields.insert(.init("id", .int(inserted[0])), at: 0)
            result = .object(fields)
        }
        try await connection.query("UPDATE billing_events SET result = \(result.serialized()) WHERE id = \(inserted[0])", logger: logger)
        return result.serialized()
    }

    struct PeriodRow {
        var id: Int64
        var planID: String
        var startedAt: Date
        var endsAt: Date
        var anchor: Date
        var interval: PeriodMath.Interval
        var autoRenew: Bool
        var status: String
    }

    static func latestPeriod(_ connection: PostgresConnection, logger: Logger, company: UUID) async throws -> PeriodRow? {
        let rows = try await connection.query(
            """
            SELECT id, plan_id, started_at, ends_at, anchor, interval, auto_renew, status FROM plan_periods
             WHERE company_id = \(company) ORDER BY started_at DESC LIMIT 1
            """,
            logger: logger
        ).decode((Int64, String, Date, Date, Date, String, Bool, String).self).collect()
        return rows.first.map {
            PeriodRow(
                id: $0.0, planID: $0.1, startedAt: $0.2, endsAt: $0.3, anchor: $0.4, interval: .init(rawValue: $0.5) ?? .month,
                autoRenew: $0.6, status: $0.7)
        }
    }

    /// Ends the running period at `at` and starts the default plan there (or leaves no plan).
    static func moveToDefault(_ connection: PostgresConnection, logger: Logger, company: UUID, at: Date, source: String) async throws {
        try await connection.query(
            """
            UPDATE plan_periods SET ends_at = \(at), status = 'expired'
             WHERE company_id = \(company) AND started_at < \(at) AND ends_at > \(at)
            """,
            logger: logger
        )
        try await connection.query(
            "UPDATE plan_periods SET status = 'expired' WHERE company_id = \(company) AND ends_at <= \(at) AND status <> 'expired' AND id = (SELECT id FROM plan_periods WHERE company_id = \(company) ORDER BY started_at DESC LIMIT 1)",
            logger: logger
        )
        if let plan = try await defaultPlan(connection, logger: logger) {
            try await PeriodStore.startPeriod(
                connection, logger: logger, company: company, plan: plan, start: at, autoRenew: true, source: source, origin: .store,
                now: at)
        }
    }

    static func defaultPlan(_ connection: PostgresConnection, logger: Logger) async throws -> String? {
        try await connection.query("SELECT id FROM plans WHERE is_default LIMIT 1", logger: logger).decode(String.self).collect().first
    }

    static func companyState(_ connection: PostgresConnection, logger: Logger, company: UUID, at: Date) async throws -> JSON {
        try await TenantStore.companyJSON(connection.query(TenantStore.companyQuery(company, at: at), logger: logger)) ?? .null
    }

}
