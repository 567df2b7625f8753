import Foundation
import Logging
import PostgresNIO

/// Top-up packs (SPEC §12): a store event for a product of kind `topup` grants, refunds or ends
/// a grant of the company (`topup_grants`) and leaves its plan alone.
extension BillingStore {
    /// A product as the billing events read it.
    struct Product: Sendable {
        var planID: String?
        var interval: PeriodMath.Interval
        var kind: ProductRecord.Kind
        var units: Int64?
        var budget: Int64?
        var validDays: Int64
    }

    /// The product `id` names (nil without one); unknown: ``BillingError/unknownProduct(_:)``.
    func product(_ connection: PostgresConnection, _ id: String?) async throws -> Product? {
        guard let id else { return nil }
        let rows = try await connection.query(
            "SELECT plan_id, interval, kind, units, budget_micros, valid_days FROM products WHERE product_id = \(id)",
            logger: logger
        ).decode((String?, String?, String, Int64?, Int64?, Int32).self).collect()
        guard let r = rows.first else { throw BillingError.unknownProduct(id) }
        return Product(
            planID: r.0, interval: r.1.flatMap(PeriodMath.Interval.init(rawValue:)) ?? .month,
            kind: ProductRecord.Kind(rawValue: r.2) ?? .subscription, units: r.3, budget: r.4, validDays: Int64(r.5))
    }

    /// What `event` does to the company's grant of the top-up `product`; returns the grant as it
    /// now stands (nil: the event changes none, e.g. a cancel).
    ///
    /// The grant is the purchase's: keyed by the event's `original_transaction_id` (Apple's
    /// `originalTransactionId`, which for a consumable is its own `transactionId`), else its
    /// `transaction_id`, unique across companies, so one store transaction grants once and never
    /// to a second company (``BillingError/transactionOfAnotherCompany``: 409).
    /// - purchase, renewal, restore: granted at `purchase_date` (else now) until `expiration_date`
    ///   (else `valid_days` later); a grant that exists stays as it is, except that a restore (a
    ///   refund reversed) gives a refunded grant back what it had left.
    /// - refund: the grant loses what is left of it (`refunded_at`); a refund that comes first
    ///   records the grant refunded, so the purchase arriving later grants nothing.
    /// - expire: the grant ends now. cancel, resume: nothing.
    func applyTopUp(_ connection: PostgresConnection, _ event: StoreEvent, product: Product, now: Date) async throws -> JSON? {
        guard let productID = event.productID else { throw BillingError.productRequired }
        let key: String
        switch event.kind {
        case .purchase, .renewal, .restore: key = event.originalTransactionID ?? event.transactionID
        case .refund, .expire:
            guard let original = event.originalTransactionID else { throw BillingError.originalTransactionRequired }
            key = original
        case .cancel, .resume: return nil
        }
        let start = event.purchaseDate ?? now
        let days = Double(product.validDays) * 86_400
        let end = event.expirationDate ?? start.addingTimeInterval(days)
        guard end > start else { throw BillingError.badDates }
        let refunded: Date? = event.kind == .refund ? now : nil
        try await connection.query(
            """
            INSERT INTO topup_grants (company_id, product_id, transaction_id, units, budget_micros, granted_at, expires_at, refunded_at)
            VALUES (\(event.companyID), \(productID), \(key), \(product.units), \(product.budget), \(start), \(end), \(refunded))
            ON CONFLICT (transaction_id) DO NOTHING
            """,
            logger: logger)
        let owner = try await connection.query(
            "SELECT company_id FROM topup_grants WHERE transaction_id = \(key) FOR UPDATE", logger: logger
        ).decode(UUID.self).collect().first
        guard owner == event.companyID else { throw BillingError.transactionOfAnotherCompany }
        switch event.kind {
        case .refund:
            try await connection.query(
                "UPDATE topup_grants SET refunded_at = \(now) WHERE transaction_id = \(key) AND refunded_at IS NULL", logger: logger)
        case .restore:
            try await connection.query("UPDATE topup_grants SET refunded_at = NULL WHERE transaction_id = \(key)", logger: logger)
        case .expire:
            try await connection.query(
                "UPDATE topup_grants SET expires_at = greatest(granted_at + interval '1 microsecond', least(expires_at, \(now))) WHERE transaction_id = \(key)",
                logger: logger)
        default: break
        }
        let query: PostgresQuery = "SELECT \(unescaped: TopUpGrant.columns) FROM topup_grants WHERE transaction_id = \(key)"
        let grant = try await connection.query(query, logger: logger).decode(TopUpGrant.Row.self).collect().first
        return grant.map { TopUpGrant(row: $0).json(at: now) }
    }
}

extension BillingStore {
    /// The top-up grants (SPEC §12) recomputed from the ledger: `units_used` is the units of the
    /// charged rows it paid (`units_grant_id`; its part, `units_grant_part`), `cost_used` /
    /// `cost_held` its parts of the settled costs and of the open holds of the charged rows whose
    /// cost it paid part of (`cost_grant_id`; `cost_grant_part` of the hold, and of a cost what
    /// exceeds the plan's part of the hold). A part NULL is the whole (rows before migration 0020).
    /// A mismatch names the grant (`window`: `grant <id>`) and no period. The rows' parts are
    /// `usage_ledger_charged_all`'s, as ``verify()`` reads them (dropped months' totals included).
    func grantMismatches(_ client: PostgresClient) async throws -> [Mismatch] {
        let rows = try await client.query(
            """
            WITH units AS (
                SELECT company_id, units_grant_id AS id, sum(grant_units)::bigint AS units FROM usage_ledger_charged_all
                 WHERE units_grant_id IS NOT NULL GROUP BY company_id, units_grant_id),
            cost AS (
                SELECT company_id, cost_grant_id AS id, COALESCE(SUM(grant_cost_used), 0)::bigint AS used,
                       COALESCE(SUM(grant_cost_held), 0)::bigint AS held
                  FROM usage_ledger_charged_all WHERE cost_grant_id IS NOT NULL GROUP BY company_id, cost_grant_id)
            SELECT g.company_id, g.id, m.measure, m.counter, m.ledger
              FROM topup_grants g
              LEFT JOIN units u ON u.company_id = g.company_id AND u.id = g.id
              LEFT JOIN cost c ON c.company_id = g.company_id AND c.id = g.id
             CROSS JOIN LATERAL (VALUES ('units', g.units_used, COALESCE(u.units, 0)),
                                        ('cost_used', g.cost_used, COALESCE(c.used, 0)),
                                        ('cost_held', g.cost_held, COALESCE(c.held, 0))) AS m (measure, counter, ledger)
             WHERE m.counter <> m.ledger
             ORDER BY g.company_id, g.id, m.measure
            """, logger: logger)
        var out: [Mismatch] = []
        for try await (company, grant, measure, counter, ledger) in rows.decode((UUID, Int64, String, Int64, Int64).self) {
            out.append(
                Mismatch(
                    companyID: company, periodID: 0, userID: nil, counter: counter, ledger: ledger, window: "grant \(grant)",
                    measure: Mismatch.Measure(rawValue: measure) ?? .units))
        }
        return out
    }
}
