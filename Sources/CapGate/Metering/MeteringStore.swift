import Foundation
import Logging
import PostgresNIO

/// The metering hot path in PostgreSQL: admit, refund and settle, one round trip each, plus
/// the read-only usage state. The SQL functions live in `db/migrations/0002_admission.sql`.
public struct MeteringStore: Sendable {
    let database: Database
    /// `capgate_admit_relaxed` (synchronous_commit off) instead of `capgate_admit`.
    let relaxed: Bool

    public init(database: Database, relaxed: Bool = false) {
        self.database = database
        self.relaxed = relaxed
    }

    /// Runs the admission transaction (`capgate_admit`): exact under any concurrency.
    public func admit(_ r: AdmissionRequest) async throws -> Admission {
        let units = Int32(r.units)
        let function = relaxed ? "capgate_admit_relaxed" : "capgate_admit"
        let row = try await database.run { client in
            let rows = try await client.query(
                """
                SELECT decision, ledger_id, period_id, plan_id, plan_name, period_start, period_end,
                       company_used, company_cap, user_used, user_cap
                  FROM \(unescaped: function)(\(r.companyID), \(r.userID), \(units), \(r.method), \(r.route), \(r.model),
                                     \(r.feature), \(r.requestID), \(r.idempotencyKey), \(r.at))
                """,
                logger: database.logger
            )
            for try await row in rows.decode(
                (String, Int64?, Int64?, String?, String?, Date?, Date?, Int64?, Int64?, Int64?, Int64?).self
            ) {
                return Optional(row)
            }
            return nil
        }
        guard let row, let decision = Admission.Decision(rawValue: row.0) else {
            throw DatabaseError.other("capgate_admit returned nothing")
        }
        return try await complete(
            decision: decision, ledgerID: row.1, periodID: row.2, plan: row.3, planName: row.4, start: row.5, end: row.6,
            companyUsed: row.7, companyCap: row.8, userUsed: row.9, userCap: row.10
        )
    }

    /// Authenticates an API key (by its SHA-256) and admits for its user, in one round trip
    /// (`capgate_admit_key`). Throws the 401 when the key is unknown, revoked or its user disabled.
    public func admit(key: String, _ r: AdmissionRequest) async throws -> (UserIdentity, Admission) {
        let hash = ApiKeyGenerator.hash(key)
        let units = Int32(r.units)
        let relaxed = self.relaxed
        let row = try await database.run { client in
            let rows = try await client.query(
                """
                SELECT auth, company_id, user_id, role, decision, ledger_id, period_id, plan_id, plan_name, period_start,
                       period_end, company_used, company_cap, user_used, user_cap
                  FROM capgate_admit_key(\(hash), \(units), \(r.method), \(r.route), \(r.model), \(r.feature),
                                         \(r.requestID), \(r.idempotencyKey), \(r.at), \(relaxed))
                """,
                logger: database.logger
            )
            for try await row in rows.decode(
                (String, UUID?, UUID?, String?, String?, Int64?, Int64?, String?, String?, Date?, Date?, Int64?, Int64?, Int64?, Int64?)
                    .self
            ) {
                return Optional(row)
            }
            return nil
        }
        guard let row else { throw DatabaseError.other("capgate_admit_key returned nothing") }
        guard row.0 == "ok", let company = row.1, let user = row.2, let decisionText = row.4,
            let decision = Admission.Decision(rawValue: decisionText)
        else {
            throw Authenticator.keyError(row.0)
        }
        let identity = UserIdentity(
            companyID: company, userID: user, role: UserIdentity.Role(rawValue: row.3 ?? "") ?? .member, credential: .apiKey)
        let admission = try await complete(
            decision: decision, ledgerID: row.5, periodID: row.6, plan: row.7, planName: row.8, start: row.9, end: row.10,
            companyUsed: row.11, companyCap: row.12, userUsed: row.13, userCap: row.14
        )
        return (identity, admission)
    }

    /// Builds the admission result; a refusal also looks up the upgrade offer.
    func complete(
        decision: Admission.Decision, ledgerID: Int64?, periodID: Int64?, plan: String?, planName: String?, start: Date?, end: Date?,
        companyUsed: Int64?, companyCap: Int64?, userUsed: Int64?, userCap: Int64?
    ) async throws -> Admission {
        var state = UsageState(
            plan: plan.map { UsageState.PlanRef(id: $0, name: planName ?? $0) },
            periodStart: start, periodEnd: end,
            companyUsed: companyUsed ?? 0, companyLimit: companyCap, userUsed: userUsed ?? 0, userLimit: userCap
        )
        if !decision.admitted {
            state.upgrade = try await upgrade(from: state.plan?.id)
            if decision == .noActivePlan {
                state.companyUsed = 0
                state.userUsed = 0
            }
        }
        return Admission(decision: decision, ledgerID: ledgerID, periodID: periodID, state: state)
    }

    /// Gives back a charge (`capgate_refund`). Returns false when it was already refunded.
    @discardableResult
    public func refund(companyID: UUID, ledgerID: Int64, upstreamStatus: Int?) async throws -> Bool {
        let status = upstreamStatus.map(Int32.init)
        return try await database.run { client in
            let rows = try await client.query(
                "SELECT capgate_refund(\(companyID), \(ledgerID), \(status))",
                logger: database.logger
            )
            for try await value in rows.decode(Bool.self) { return value }
            return false
        }
    }

    /// Records the upstream status and token counts on a charge that stands.
    public func settle(companyID: UUID, ledgerID: Int64, upstreamStatus: Int, inputTokens: Int64?, outputTokens: Int64?) async throws {
        let status = Int32(upstreamStatus)
        try await database.run { client in
            try await client.query(
                "SELECT capgate_settle(\(companyID), \(ledgerID), \(status), \(inputTokens), \(outputTokens))",
                logger: database.logger
            )
        }
    }

    /// The usage state of a company (and one of its users) at `at`, without changing anything.
    public func state(companyID: UUID, userID: UUID?, at: Date = Date()) async throws -> UsageState {
        let row = try await database.run { client in
            let rows = try await client.query(
                """
                SELECT pp.plan_id, pl.name, pp.started_at, pp.ends_at,
                       COALESCE((SELECT used FROM company_usage cu WHERE cu.company_id = pp.company_id AND cu.period_id = pp.id), 0),
                       pl.monthly_company_cap,
                       COALESCE((SELECT used FROM user_usage uu WHERE uu.company_id = pp.company_id AND uu.period_id = pp.id
                                    AND uu.user_id = \(userID)), 0),
                       COALESCE((SELECT monthly_cap FROM users u WHERE u.company_id = pp.company_id AND u.id = \(userID)), pl.monthly_user_cap)
                  FROM plan_periods pp JOIN plans pl ON pl.id = pp.plan_id
                 WHERE pp.company_id = \(companyID) AND pp.started_at <= \(at) AND pp.ends_at > \(at)
                """,
                logger: database.logger
            )
            for try await row in rows.decode((String, String, Date, Date, Int64, Int64?, Int64, Int64?).self) {
                return Optional(row)
            }
            return nil
        }
        guard let row else {
            var state = UsageState(
                plan: nil, periodStart: nil, periodEnd: nil, companyUsed: 0, companyLimit: nil, userUsed: userID == nil ? nil : 0,
                userLimit: nil)
            state.upgrade = try await upgrade(from: nil)
            return state
        }
        var state = UsageState(
            plan: .init(id: row.0, name: row.1), periodStart: row.2, periodEnd: row.3,
            companyUsed: row.4, companyLimit: row.5,
            userUsed: userID == nil ? nil : row.6, userLimit: row.7
        )
        state.upgrade = try await upgrade(from: row.0)
        return state
    }

    /// The next active plan by sort order with a larger company or user cap (NULL = unlimited
    /// counts as larger); from no plan, the first active plan with any cap room.
    public func upgrade(from planID: String?) async throws -> UsageState.Upgrade? {
        try await database.run { client in
            let rows = try await client.query(
                """
                SELECT n.id, n.monthly_company_cap, n.monthly_user_cap
                  FROM plans n LEFT JOIN plans c ON c.id = \(planID)
                 WHERE n.is_active AND n.id IS DISTINCT FROM c.id
                   AND (c.id IS NULL OR (n.sort_order > c.sort_order AND (
                          (c.monthly_company_cap IS NOT NULL AND (n.monthly_company_cap IS NULL OR n.monthly_company_cap > c.monthly_company_cap))
                       OR (c.monthly_user_cap IS NOT NULL AND (n.monthly_user_cap IS NULL OR n.monthly_user_cap > c.monthly_user_cap)))))
                 ORDER BY n.sort_order, n.id
                 LIMIT 1
                """,
                logger: database.logger
            )
            for try await (id, company, user) in rows.decode((String, Int64?, Int64?).self) {
                return UsageState.Upgrade(plan: id, companyLimit: company, userLimit: user)
            }
            return nil
        }
    }
}
