import Foundation
import Logging
import PostgresNIO

/// Starts, ends and extends a company's plan periods. Every change runs in one transaction
/// that first locks the company row, so period changes for one company never interleave.
public struct PeriodStore: Sendable {
    let database: Database
    var logger: Logger { database.logger }

    public init(database: Database) {
        self.database = database
    }

    /// Where a period's plan came from (`plan_periods.plan_origin`, SPEC §12).
    public enum PlanOrigin: String, Sendable {
        /// The operator assigned it (a company's creation, `PUT …/plan`): no store purchase replaces it.
        case assigned = "operator"
        /// A store event set it (or moved the company to the default plan).
        case store
    }

    public enum PeriodError: Error {
        case unknownCompany
        case unknownPlan
        case periodHasUsage
        /// Calls were counted after `start` and the new period would already be over by now.
        case endsBeforeItBegins
    }

    /// Starts a period on `plan` at `start`, anchored there, one interval long (or to `end`);
    /// a period that was running ends where the new one starts.
    ///
    /// A period that already counted calls is never rewritten. When one starts at or after
    /// `start` (a store event delivered late, a `started_at` in the past), the new period begins
    /// now instead, still anchored at `start` (so it ends where it would have), and the calls
    /// counted since `start` stay in the period that admitted them. Periods after `start` without
    /// calls are replaced.
    ///
    /// `origin` and `subscription` record where the plan came from (SPEC §12): the operator's
    /// assignment, or a store event and the store subscription (original transaction id) it is of.
    @discardableResult
    public static func startPeriod(
        _ connection: PostgresConnection, logger: Logger, company: UUID, plan: String, start: Date, end: Date? = nil,
        interval: PeriodMath.Interval = .month, autoRenew: Bool, source: String, origin: PlanOrigin = .assigned,
        subscription: String? = nil, now: Date = Date()
    ) async throws -> Int64 {
        try await lockCompany(connection, logger: logger, company: company)
        guard try await connection.query("SELECT 1 FROM plans WHERE id = \(plan)", logger: logger).collect().count == 1 else {
            throw PeriodError.unknownPlan
        }
        let overlapping = try await connection.query(
            """
            SELECT pp.id, pp.started_at, pp.ends_at,
                   -- Only periods from `start` on can be replaced; a running one is never scanned.
                   CASE WHEN pp.started_at >= \(start)
                        THEN EXISTS (SELECT 1 FROM usage_ledger l WHERE l.company_id = pp.company_id AND l.period_id = pp.id)
                             OR EXISTS (SELECT 1 FROM ledger_dropped_totals t
                                         WHERE t.company_id = pp.company_id AND t.period_id = pp.id)
                        ELSE false END
              FROM plan_periods pp
             WHERE pp.company_id = \(company) AND pp.ends_at > \(start)
             ORDER BY pp.started_at
               FOR UPDATE OF pp
            """,
            logger: logger
        ).decode((Int64, Date, Date, Bool).self).collect()
        var begins = start
        if overlapping.contains(where: { $0.1 >= start && $0.3 }) { begins = max(start, now) }
        let ends = end ?? PeriodMath.add(months: interval == .month ? 1 : 12, to: start)
        guard ends > begins else { throw PeriodError.endsBeforeItBegins }
        for (id, startedAt, endsAt, used) in overlapping {
            if startedAt < begins {
                guard endsAt > begins else { continue }  // over before the new period begins
                try await connection.query(
                    "UPDATE plan_periods SET ends_at = \(begins), status = 'superseded' WHERE company_id = \(company) AND id = \(id)",
                    logger: logger
                )
            } else {
                guard !used else { throw PeriodError.periodHasUsage }  // calls counted in the future: a clock step
                try await connection.query("DELETE FROM user_usage WHERE company_id = \(company) AND period_id = \(id)", logger: logger)
                try await connection.query("DELETE FROM company_usage WHERE company_id = \(company) AND period_id = \(id)", logger: logger)
                try await connection.query("DELETE FROM plan_periods WHERE company_id = \(company) AND id = \(id)", logger: logger)
            }
        }
        let rows = try await connection.query(
            """
            INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, interval, auto_renew, source,
                                      plan_origin, store_subscription)
            VALUES (\(company), \(plan), \(begins), \(ends), \(start), \(interval.rawValue), \(autoRenew), \(source),
                    \(origin.rawValue), \(subscription))
            RETURNING id
            """,
            logger: logger
        ).decode(Int64.self).collect()
        let id = rows[0]
        try await connection.query(
            "INSERT INTO company_usage (company_id, period_id, used) VALUES (\(company), \(id), 0)", logger: logger
        )
        return id
    }

    static func lockCompany(_ connection: PostgresConnection, logger: Logger, company: UUID) async throws {
        let found = try await connection.query("SELECT 1 FROM companies WHERE id = \(company) FOR UPDATE", logger: logger).collect()
        guard !found.isEmpty else { throw PeriodError.unknownCompany }
    }

    /// `POST /admin/v1/companies`: the company and, when a plan is given, its first period, in
    /// one transaction.
    public func createCompany(
        id: UUID, name: String, plan: String?, start: Date, autoRenew: Bool, timeZone: String = "UTC", webhookURL: String? = nil,
        by actor: AuditActor? = nil
    ) async throws {
        do {
            try await database.audited(actor) { connection in
                try await connection.query(
                    "INSERT INTO companies (id, name, time_zone, webhook_url) VALUES (\(id), \(name), \(timeZone), \(webhookURL))",
                    logger: logger)
                if let plan {
                    try await Self.recordAssignment(connection, logger: logger, company: id, plan: plan, start: start, autoRenew: autoRenew)
                }
                let after = try await AuditLog.snapshot(
                    """
                    SELECT ((to_jsonb(c) - 'app_account_token') || jsonb_build_object('period', (
                               SELECT to_jsonb(pp) FROM plan_periods pp WHERE pp.company_id = c.id
                                ORDER BY pp.started_at DESC LIMIT 1)))::text
                      FROM companies c WHERE c.id = \(id)
                    """, on: connection, logger: logger)
                return ((), AuditEntry(action: "company.create", companyID: id, targetID: id.lowercased, before: nil, after: after))
            }
        } catch DatabaseError.constraint(let state, _, _) where state == "23505" {
            throw GatewayError.conflict("A company with id \(id.uuidString.lowercased()) already exists.")
        } catch PeriodError.unknownPlan {
            throw GatewayError.notFound("No plan with id '\(plan ?? "")'.")
        }
    }

    static func recordAssignment(
        _ connection: PostgresConnection, logger: Logger, company: UUID, plan: String, start: Date, autoRenew: Bool
    ) async throws {
        let id = try await startPeriod(
            connection, logger: logger, company: company, plan: plan, start: start, autoRenew: autoRenew, source: "operator")
        let payload = JSON.obj(["plan": .string(plan), "started_at": JSON(start), "auto_renew": .bool(autoRenew), "period_id": .int(id)])
        try await connection.query(
            """
            INSERT INTO billing_events (company_id, type, plan_id, payload)
            VALUES (\(company), 'plan_assigned', \(plan), \(payload.serialized())::jsonb)
            """,
            logger: logger
        )
    }

    /// `PUT /admin/v1/companies/{id}/plan`.
    public func assignPlan(company: UUID, plan: String, start: Date, autoRenew: Bool, by actor: AuditActor? = nil) async throws {
        do {
            try await database.audited(actor) { connection in
                let before = try await AuditLog.snapshot(AuditLog.period(company), on: connection, logger: logger)
                try await Self.recordAssignment(
                    connection, logger: logger, company: company, plan: plan, start: start, autoRenew: autoRenew)
                let after = try await AuditLog.snapshot(AuditLog.period(company), on: connection, logger: logger)
                return (
                    (),
                    AuditEntry(
                        action: "company.assign_plan", companyID: company, targetID: company.lowercased, before: before, after: after)
                )
            }
        } catch PeriodError.unknownCompany {
            throw GatewayError.notFound("No company with that id.")
        } catch PeriodError.unknownPlan {
            throw GatewayError.notFound("No plan with id '\(plan)'.")
        } catch PeriodError.periodHasUsage {
            throw GatewayError.conflict("A period that starts after now already has usage; check the server's clock.")
        } catch PeriodError.endsBeforeItBegins {
            throw GatewayError.conflict("Calls were counted after started_at, so the new period would begin now, after it ends.")
        }
    }
}
