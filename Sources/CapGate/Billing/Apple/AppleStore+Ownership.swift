import Foundation
import PostgresNIO

/// Which company an App Store payload is for, and whether its event may touch that company's
/// plan (SPEC §12): purchases are bound to the company that made them.
extension AppleStore {
    /// The company a payload's transaction belongs to.
    enum Owner: Equatable {
        /// Its subscription's company, or the one its `appAccountToken` names.
        case company(UUID)
        /// Neither: stored as unmatched, for the operator.
        case unmatched
        /// Its subscription is linked to `linked`, and its token names another company: stored,
        /// not applied, listed for the operator with `reason`.
        case refused(linked: UUID, reason: String)
    }

    /// Why an event is stored without being applied (nil from ``verdict(_:_:now:)``: apply it).
    enum Verdict: Equatable {
        /// A store purchase kept off the operator's plan: listed with the unmatched ones.
        case refused(String)
        /// Nothing to do for this company's plan (the refund of a subscription that did not set it).
        case skipped(String)

        var outcome: Outcome {
            switch self {
            case .refused: .refused
            case .skipped: .stored
            }
        }

        var reason: String {
            switch self {
            case .refused(let reason), .skipped(let reason): reason
            }
        }
    }

    /// The subscription's linked company, else the company whose current purchase token the
    /// transaction's `appAccountToken` is (an old token, or a company id, names none). A linked
    /// subscription whose token names another company is refused: a subscription is linked once.
    func owner(_ connection: PostgresConnection, transaction: AppleTransaction, linked: UUID?) async throws -> Owner {
        var named: UUID?
        if let token = transaction.accountToken {
            named = try await connection.query("SELECT id FROM companies WHERE app_account_token = \(token)", logger: logger)
                .decode(UUID.self).collect().first
        }
        switch (linked, named) {
        case (let linked?, let named?) where named != linked:
            return .refused(
                linked: linked,
                reason: "subscription \(transaction.originalTransactionId.prefix(100)) belongs to company \(linked.lowercased); "
                    + "its appAccountToken names company \(named.lowercased)")
        case (let linked?, _): return .company(linked)
        case (nil, let named?): return .company(named)
        case (nil, nil): return .unmatched
        }
    }

    /// The plan period running at `now` (the latest started): its plan, where the plan came from,
    /// and the store subscription that set it.
    struct CurrentPlan: Sendable {
        var planID: String
        var isDefault: Bool
        var origin: PeriodStore.PlanOrigin
        var subscription: String?
    }

    func currentPlan(_ connection: PostgresConnection, company: UUID, at now: Date) async throws -> CurrentPlan? {
        let rows = try await connection.query(
            """
            SELECT pp.plan_id, pl.is_default, pp.plan_origin, pp.store_subscription
              FROM plan_periods pp JOIN plans pl ON pl.id = pp.plan_id
             WHERE pp.company_id = \(company) AND pp.started_at <= \(now)
             ORDER BY pp.started_at DESC LIMIT 1
            """,
            logger: logger
        ).decode((String, Bool, String, String?).self).collect()
        return rows.first.map {
            CurrentPlan(planID: $0.0, isDefault: $0.1, origin: PeriodStore.PlanOrigin(rawValue: $0.2) ?? .assigned, subscription: $0.3)
        }
    }

    /// What a store subscription's event may do to its company's plan (SPEC §12); nil: apply it.
    /// A purchase, restore or renewal replaces only the default plan or a plan that came from the
    /// store (never one the operator assigned); a refund, expiry, cancellation or resumption acts
    /// only when its subscription is the one that set the running plan. A top-up's events leave
    /// the plan alone and are not judged here. The event's company is locked first.
    func verdict(_ connection: PostgresConnection, _ event: BillingStore.StoreEvent, now: Date) async throws -> Verdict? {
        try await PeriodStore.lockCompany(connection, logger: logger, company: event.companyID)
        if event.topUpOnly { return nil }
        if let product = try await billing.product(connection, event.productID), product.kind == .topup { return nil }
        let current = try await currentPlan(connection, company: event.companyID, at: now)
        switch event.kind {
        case .purchase, .restore, .renewal:
            guard let current, current.origin == .assigned, !current.isDefault else { return nil }
            return .refused(
                "company \(event.companyID.lowercased) is on plan '\(current.planID)', which the operator assigned: "
                    + "a store purchase does not replace it")
        case .refund, .expire, .cancel, .resume:
            if let current, let subscription = current.subscription, subscription == event.originalTransactionID { return nil }
            return .skipped(
                "the company's plan\(current.map { " '\($0.planID)'" } ?? "") was not set by subscription "
                    + "\((event.originalTransactionID ?? "").prefix(100)): left as it is")
        }
    }

    /// `POST /admin/v1/companies/{id}/app-account-token`: a new random purchase token for
    /// `company`, audited; the old one matches nothing from now on. Nil: no such company.
    func rotateToken(company: UUID, by actor: AuditActor?) async throws -> UUID? {
        try await database.audited(actor) { connection in
            let before = try await AuditLog.snapshot(AuditLog.locked(AuditLog.company(company)), on: connection, logger: logger)
            guard before != nil else { return (nil, nil) }
            let token = try await connection.query(
                """
                UPDATE companies SET app_account_token = gen_random_uuid(), app_account_token_rotated_at = now()
                 WHERE id = \(company) RETURNING app_account_token
                """,
                logger: logger
            ).decode(UUID.self).collect().first
            let after = try await AuditLog.snapshot(AuditLog.company(company), on: connection, logger: logger)
            return (
                token,
                AuditEntry(
                    action: "company.rotate_app_account_token", companyID: company, targetID: company.lowercased, before: before,
                    after: after)
            )
        }
    }

    /// The purchase token of `company` (nil: no such company).
    func token(of company: UUID, on connection: PostgresConnection) async throws -> UUID? {
        try await connection.query("SELECT app_account_token FROM companies WHERE id = \(company)", logger: logger)
            .decode(UUID.self).collect().first
    }
}
