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
        /// The ledger's monthly partitions the run made ahead (``LedgerPartitions``), by name.
        public var partitionsMade: [String] = []
        /// Why the partitions could not be made (a lock busy for a second, no right to create a
        /// table); the periods moved all the same, and the gateways' hourly job tries again.
        public var partitionsFailure: String? = nil
        /// What retention did after the run (`capgate rollover` with `ledger.retentionMonths`
        /// set, not in a dry run): each month past it, dropped or refused with its reason.
        public var retention: [LedgerRetention.Outcome] = []

        public var description: String {
            if skippedLocked { return "another rollover is running; nothing done" }
            var text = "moved \(moved) companies, \(toDefault) to default plan, \(unchanged) unchanged"
            if withoutPlan > 0 { text += ", \(withoutPlan) left without a plan (no default plan)" }
            if !partitionsMade.isEmpty { text += ", made ledger partitions \(partitionsMade.joined(separator: " "))" }
            if let partitionsFailure { text += ", ledger partitions not made (\(partitionsFailure))" }
            for outcome in retention {
                switch outcome {
                case .dropped(let dropped): text += ", dropped ledger month \(dropped.month) (\(dropped.rows) rows)"
                case .refused(let month, let refusal): text += ", ledger month \(month) kept (\(refusal))"
                }
            }
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
    ///
    /// Then (not in a dry run) the ledger's partitions of the current month and the
    /// ``LedgerPartitions/monthsAhead`` after it, by the clock (`at` moves periods only), are made
    /// if missing; a failure to make them is told in the summary, not thrown (the periods moved).
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
                    if !dryRun {
                        do {
                            summary.partitionsMade = try await LedgerPartitions.makeAhead(
                                on: connection, months: LedgerPartitions.monthsAhead, at: Date(), logger: logger)
                        } catch {
                            summary.partitionsFailure = Migrator.describe(error)
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

    /// One company, by `capgate_roll_company` (db/functions/capgate_roll_company.sql): the same SQL
    /// that `SELECT * FROM capgate_rollover()` runs from pg_cron.
    func rollCompany(_ connection: PostgresConnection, company: UUID, at: Date) async throws -> RolloverChange {
        let rows = try await connection.query("SELECT capgate_roll_company(\(company), \(at))", logger: logger)
            .decode(String.self).collect()
        switch rows.first {
        case "renewed": return .renewed
        case "to_default": return .toDefault
        case "no_plan": return .noPlan
        default: return .none
        }
    }

    /// One disagreement between a counter and the ledger.
    public struct Mismatch: Sendable, CustomStringConvertible {
        public var companyID: UUID
        public var periodID: Int64
        public var userID: UUID?
        /// In the unit of ``measure``: units, or micro-dollars for a cost.
        public var counter: Int64
        public var ledger: Int64
        /// For a feature counter (SPEC §8): its feature and window, e.g. `day 2026-11-24T05:00:00Z`.
        public var feature: String? = nil
        public var window: String? = nil
        /// Which column of the counter disagrees.
        public var measure: Measure = .units

        /// A counter's column that `verify` recomputes.
        public enum Measure: String, Sendable {
            /// `used`: the charged rows' units.
            case units
            /// `cost_used` (SPEC §11): the charged rows' `cost_micros` that have a `cost_source`.
            case costUsed = "cost_used"
            /// `cost_held` (SPEC §11): the charged rows' `hold_micros` without a `cost_source` (open holds).
            case costHeld = "cost_held"
            /// A rollup's column (migration 0028), against the charged rows of its key:
            /// `counter` is the rollup's value.
            case rollupCalls = "rollup_calls"
            case rollupUnits = "rollup_units"
            case rollupTokens = "rollup_tokens"
            case rollupCost = "rollup_cost"
            case rollupHeld = "rollup_held"
            /// Charges without a settlement (migration 0029).
            case rollupUnsettled = "rollup_unsettled"

            var isRollup: Bool { rawValue.hasPrefix("rollup_") }
        }

        public var description: String {
            if measure.isRollup {
                return
                    "mismatch: company \(companyID.uuidString.lowercased()) period \(periodID) \(window ?? ""): \(measure.rawValue) rollup \(counter), ledger \(ledger)"
            }
            let who = userID.map { "user \($0.uuidString.lowercased())" } ?? "company"
            let what = feature.map { " feature \($0) \(window ?? "")" } ?? window.map { " top-up \($0)" } ?? ""
            let company = companyID.uuidString.lowercased()
            let values =
                measure == .units
                ? "counter \(counter), ledger \(ledger)"
                : "\(measure.rawValue): counter \(Micros(counter).decimal) USD, ledger \(Micros(ledger).decimal) USD"
            return "mismatch: company \(company) period \(periodID) \(who)\(what): \(values)"
        }
    }

    /// Recomputes every counter from the ledger (charged rows) and returns the disagreements:
    /// units, and the cost counters of SPEC §11 (`cost_used`: the costs of rows with a
    /// `cost_source`, `cost_held`: the holds of rows without one), in one scan of the ledger. A
    /// company counter leaves out the parts of calls top-up grants paid (SPEC §12:
    /// `units_grant_part`, `cost_grant_part`, and of a settled cost what exceeds the plan's part
    /// of the hold; a part NULL with its grant set is the whole); the grants are recomputed too
    /// (``grantMismatches(_:)``).
    ///
    /// Each row's parts are the view `usage_ledger_charged` (migration 0027), read with the totals
    /// of the months retention dropped (`usage_ledger_charged_all`): a counter that still counts
    /// calls of a dropped month is checked against them (docs/ledger.md#retention).
    public func verify() async throws -> [Mismatch] {
        try await database.run { client in
            let rows = try await client.query(
                """
                WITH ledger_company AS (
                    SELECT company_id, period_id, COALESCE(SUM(company_units), 0)::bigint AS units,
                           COALESCE(SUM(company_cost_used), 0)::bigint AS cost_used,
                           COALESCE(SUM(company_cost_held), 0)::bigint AS cost_held
                      FROM usage_ledger_charged_all GROUP BY company_id, period_id),
                ledger_user AS (
                    SELECT company_id, period_id, user_id, SUM(units)::bigint AS units,
                           COALESCE(SUM(user_cost_used), 0)::bigint AS cost_used,
                           COALESCE(SUM(user_cost_held), 0)::bigint AS cost_held
                      FROM usage_ledger_charged_all GROUP BY company_id, period_id, user_id),
                compared AS (
                    SELECT COALESCE(c.company_id, l.company_id) AS company_id, COALESCE(c.period_id, l.period_id) AS period_id,
                           NULL::uuid AS user_id, COALESCE(c.used, 0) AS used, COALESCE(l.units, 0) AS units,
                           COALESCE(c.cost_used, 0) AS cost_used, COALESCE(l.cost_used, 0) AS ledger_cost_used,
                           COALESCE(c.cost_held, 0) AS cost_held, COALESCE(l.cost_held, 0) AS ledger_cost_held
                      FROM company_usage c FULL JOIN ledger_company l ON l.company_id = c.company_id AND l.period_id = c.period_id
                    UNION ALL
                    SELECT COALESCE(u.company_id, l.company_id), COALESCE(u.period_id, l.period_id), COALESCE(u.user_id, l.user_id),
                           COALESCE(u.used, 0), COALESCE(l.units, 0), COALESCE(u.cost_used, 0), COALESCE(l.cost_used, 0),
                           COALESCE(u.cost_held, 0), COALESCE(l.cost_held, 0)
                      FROM user_usage u FULL JOIN ledger_user l
                        ON l.company_id = u.company_id AND l.period_id = u.period_id AND l.user_id = u.user_id)
                SELECT company_id, period_id, user_id, m.measure, m.counter, m.ledger
                  FROM compared CROSS JOIN LATERAL (VALUES ('units', used, units), ('cost_used', cost_used, ledger_cost_used),
                                                           ('cost_held', cost_held, ledger_cost_held)) AS m (measure, counter, ledger)
                 WHERE m.counter <> m.ledger
                 ORDER BY user_id NULLS FIRST, company_id, period_id, m.measure
                """,
                logger: logger
            )
            var out: [Mismatch] = []
            for try await (company, period, user, measure, counter, ledger) in rows.decode((UUID, Int64, UUID?, String, Int64, Int64).self)
            {
                out.append(
                    Mismatch(
                        companyID: company, periodID: period, userID: user, counter: counter, ledger: ledger,
                        measure: Mismatch.Measure(rawValue: measure) ?? .units))
            }
            return out + (try await featureMismatches(client)) + (try await grantMismatches(client))
                + (try await rollupMismatches(client))
        }
    }

    /// The feature counters (SPEC §8) recomputed from the ledger: a period window is keyed by its
    /// plan period's start, a day window by the `feature_day` the admission charged (the company's
    /// zone then; a later zone change moves no charged day).
    func featureMismatches(_ client: PostgresClient) async throws -> [Mismatch] {
        let rows = try await client.query(
            """
            WITH charged AS (
                SELECT l.company_id, l.user_id, l.feature, l.period_id, pp.started_at, l.feature_day, l.feature_units AS units
                  FROM usage_ledger_charged_all l JOIN plan_periods pp ON pp.id = l.period_id
                 WHERE l.feature_units IS NOT NULL),
            ledger AS (
                SELECT company_id, NULL::uuid AS user_id, feature, 'period' AS span, started_at AS starts_at,
                       max(period_id) AS period_id, sum(units)::bigint AS units
                  FROM charged GROUP BY company_id, feature, started_at
                UNION ALL
                SELECT company_id, NULL::uuid, feature, 'day', feature_day, max(period_id), sum(units)::bigint
                  FROM charged WHERE feature_day IS NOT NULL GROUP BY company_id, feature, feature_day
                UNION ALL
                SELECT company_id, user_id, feature, 'period', started_at, max(period_id), sum(units)::bigint
                  FROM charged GROUP BY company_id, user_id, feature, started_at
                UNION ALL
                SELECT company_id, user_id, feature, 'day', feature_day, max(period_id), sum(units)::bigint
                  FROM charged WHERE feature_day IS NOT NULL GROUP BY company_id, user_id, feature, feature_day),
            counters AS (
                SELECT company_id, NULL::uuid AS user_id, feature_id AS feature, span, starts_at, used FROM company_feature_usage
                UNION ALL
                SELECT company_id, user_id, feature_id, span, starts_at, used FROM user_feature_usage),
            keyed_ledger AS (SELECT *, coalesce(user_id, '00000000-0000-0000-0000-000000000000') AS who FROM ledger),
            keyed_counters AS (SELECT *, coalesce(user_id, '00000000-0000-0000-0000-000000000000') AS who FROM counters)
            SELECT coalesce(c.company_id, l.company_id), coalesce(l.period_id, (
                       SELECT max(pp.id) FROM plan_periods pp WHERE pp.company_id = c.company_id AND pp.started_at <= c.starts_at)),
                   coalesce(c.user_id, l.user_id), coalesce(c.feature, l.feature), coalesce(c.span, l.span),
                   coalesce(c.starts_at, l.starts_at), coalesce(c.used, 0), coalesce(l.units, 0)
              FROM keyed_counters c FULL JOIN keyed_ledger l
                ON l.company_id = c.company_id AND l.who = c.who AND l.feature = c.feature AND l.span = c.span
               AND l.starts_at = c.starts_at
             WHERE coalesce(c.used, 0) <> coalesce(l.units, 0)
            """, logger: logger)
        var out: [Mismatch] = []
        for try await (company, period, user, feature, span, start, counter, ledger) in rows.decode(
            (UUID, Int64?, UUID?, String, String, Date, Int64, Int64).self)
        {
            out.append(
                Mismatch(
                    companyID: company, periodID: period ?? 0, userID: user, counter: counter, ledger: ledger, feature: feature,
                    window: "\(span) \(Timestamp.format(start))"))
        }
        return out
    }
}
