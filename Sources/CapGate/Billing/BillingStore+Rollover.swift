import Foundation
import Logging
import PostgresNIO

extension BillingStore {
    /// What a rollover run did (or, with `dryRun`, would do).
    public struct RolloverSummary: Sendable, CustomStringConvertible {
        public var moved = 0
        public var toDefault = 0
        public var withoutPlan = 0
        public var unchanged = 0
        public var skippedLocked = false
        public var dryRun = false

        public var description: String {
            if skippedLocked { return "another rollover is running; nothing done" }
            var text = "moved \(moved) companies, \(toDefault) to default plan, \(unchanged) unchanged"
            if withoutPlan > 0 { text += ", \(withoutPlan) left without a plan (no default plan)" }
            if dryRun { text += " (dry run: nothing changed)" }
            return text
        }
    }

    static let rolloverLockKey: Int64 = 0x4361_7047_6174_6502

    /// Moves every company whose period ended by `at` into the period that contains `at`.
    ///
    /// One transaction per company (inside one outer session holding an advisory lock, so two
    /// runners never collide); `wait: false` returns at once when another run holds the lock.
    /// Auto-renewing periods keep their plan; cancelled or expired ones move to the default
    /// plan, or to no plan when there is none. Bounds come from the anchor, so missed months
    /// are caught up in one step, and a second run finds nothing to do.
    public func rollover(at: Date, dryRun: Bool, wait: Bool = true) async throws -> RolloverSummary {
        try await database.run { client in
            try await client.withConnection { connection in
                var summary = RolloverSummary()
                summary.dryRun = dryRun
                if wait {
                    try await connection.query("SELECT pg_advisory_lock(\(Self.rolloverLockKey))", logger: logger)
                } else {
                    let got =
                        try await connection.query("SELECT pg_try_advisory_lock(\(Self.rolloverLockKey))", logger: logger)
                        .decode(Bool.self).collect().first ?? false
                    if !got {
                        summary.skippedLocked = true
                        return summary
                    }
                }
                do {
                    let companies = try await connection.query("SELECT id FROM companies ORDER BY id", logger: logger).decode(UUID.self)
                        .collect()
                    for company in companies {
                        try await connection.query("BEGIN", logger: logger)
                        do {
                            let change = try await rollCompany(connection, company: company, at: at)
                            switch change {
                            case .none: summary.unchanged += 1
                            case .renewed: summary.moved += 1
                            case .toDefault:
                                summary.moved += 1
                                summary.toDefault += 1
                            case .noPlan: summary.withoutPlan += 1
                            }
                            try await connection.query(dryRun ? "ROLLBACK" : "COMMIT", logger: logger)
                        } catch {
                            _ = try? await connection.query("ROLLBACK", logger: logger)
                            throw error
                        }
                    }
                    _ = try await connection.query("SELECT pg_advisory_unlock(\(Self.rolloverLockKey))", logger: logger).collect()
                } catch {
                    _ = try? await connection.query("SELECT pg_advisory_unlock(\(Self.rolloverLockKey))", logger: logger).collect()
                    throw error
                }
                return summary
            }
        }
    }

    enum RolloverChange { case none, renewed, toDefault, noPlan }

    func rollCompany(_ connection: PostgresConnection, company: UUID, at: Date) async throws -> RolloverChange {
        try await PeriodStore.lockCompany(connection, logger: logger, company: company)
        guard let latest = try await Self.latestPeriod(connection, logger: logger, company: company) else { return .none }
        guard latest.endsAt <= at else { return .none }

        let renew = latest.autoRenew && latest.status != "expired" && latest.status != "cancelled"
        let plan: String? = renew ? latest.planID : try await Self.defaultPlan(connection, logger: logger)
        let interval = renew ? latest.interval : .month
        if !renew, plan == nil {
            // No default plan: no active plan until one is assigned. Recorded once.
            guard latest.status != "expired" else { return .none }
            try await connection.query(
                "UPDATE plan_periods SET status = 'expired' WHERE company_id = \(company) AND id = \(latest.id)", logger: logger
            )
            try await logEvent(
                connection, company: company, type: "rollover_no_plan", plan: nil,
                payload: .obj(["from_plan": .string(latest.planID), "at": JSON(at)]))
            return .noPlan
        }
        let (start, end, _) = PeriodMath.period(containing: at, anchor: latest.anchor, interval: interval)
        let from = max(start, latest.endsAt)
        try await connection.query(
            """
            INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, interval, auto_renew, source)
            VALUES (\(company), \(plan!), \(from), \(end), \(latest.anchor), \(interval.rawValue), true, 'rollover')
            """,
            logger: logger
        )
        try await connection.query(
            """
            INSERT INTO company_usage (company_id, period_id, used)
            SELECT company_id, id, 0 FROM plan_periods WHERE company_id = \(company) AND started_at = \(from)
            ON CONFLICT DO NOTHING
            """,
            logger: logger
        )
        let type = renew ? "rollover" : "rollover_to_default"
        try await logEvent(
            connection, company: company, type: type, plan: plan,
            payload: .obj([
                "from_plan": .string(latest.planID), "to_plan": JSON(plan), "start": JSON(from), "end": JSON(end), "at": JSON(at),
            ])
        )
        return renew ? .renewed : .toDefault
    }

    func logEvent(_ connection: PostgresConnection, company: UUID, type: String, plan: String?, payload: JSON) async throws {
        try await connection.query(
            "INSERT INTO billing_events (company_id, type, plan_id, payload) VALUES (\(company), \(type), \(plan), \(payload.serialized())::jsonb)",
            logger: logger
        )
    }

    /// One disagreement between a counter and the ledger.
    public struct Mismatch: Sendable, CustomStringConvertible {
        public var companyID: UUID
        public var periodID: Int64
        public var userID: UUID?
        public var counter: Int64
        public var ledger: Int64

        public var description: String {
            let who = userID.map { "user \($0.uuidString.lowercased())" } ?? "company"
            return "mismatch: company \(companyID.uuidString.lowercased()) period \(periodID) \(who): counter \(counter), ledger \(ledger)"
        }
    }

    /// Recomputes every counter from the ledger (charged rows) and returns the disagreements.
    public func verify() async throws -> [Mismatch] {
        try await database.run { client in
            let rows = try await client.query(
                """
                WITH ledger_company AS (
                    SELECT company_id, period_id, SUM(units)::bigint AS units FROM usage_ledger
                     WHERE outcome = 'charged' GROUP BY company_id, period_id),
                ledger_user AS (
                    SELECT company_id, period_id, user_id, SUM(units)::bigint AS units FROM usage_ledger
                     WHERE outcome = 'charged' GROUP BY company_id, period_id, user_id)
                SELECT COALESCE(c.company_id, l.company_id), COALESCE(c.period_id, l.period_id), NULL::uuid,
                       COALESCE(c.used, 0), COALESCE(l.units, 0)
                  FROM company_usage c FULL JOIN ledger_company l ON l.company_id = c.company_id AND l.period_id = c.period_id
                 WHERE COALESCE(c.used, 0) <> COALESCE(l.units, 0)
                UNION ALL
                SELECT COALESCE(u.company_id, l.company_id), COALESCE(u.period_id, l.period_id), COALESCE(u.user_id, l.user_id),
                       COALESCE(u.used, 0), COALESCE(l.units, 0)
                  FROM user_usage u FULL JOIN ledger_user l
                    ON l.company_id = u.company_id AND l.period_id = u.period_id AND l.user_id = u.user_id
                 WHERE COALESCE(u.used, 0) <> COALESCE(l.units, 0)
                """,
                logger: logger
            )
            var out: [Mismatch] = []
            for try await (company, period, user, counter, ledger) in rows.decode((UUID, Int64, UUID?, Int64, Int64).self) {
                out.append(Mismatch(companyID: company, periodID: period, userID: user, counter: counter, ledger: ledger))
            }
            return out
        }
    }
}
