import Foundation
import PostgresNIO

extension BillingStore {
    /// The ledger's rollups (migration 0028, compacted or not) recomputed from the charged rows the
    /// ledger holds, per key (company, quarter hour, period, feature, model), with the same
    /// `ledger_rollup_part` the triggers add: every column that differs, as a mismatch whose
    /// `counter` is the rollup's value. The months retention dropped are left out (their rollups
    /// stay, their rows are gone).
    func rollupMismatches(_ client: PostgresClient) async throws -> [Mismatch] {
        let rows = try await client.query(
            """
            WITH parts AS (
                SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, p.calls, p.units,
                       p.input_tokens + p.output_tokens + p.cache_write_tokens + p.cache_read_tokens AS tokens,
                       p.cost_micros, p.held_micros, p.unsettled, 0::bigint AS r_calls, 0::bigint AS r_units,
                       0::bigint AS r_tokens, 0::bigint AS r_cost, 0::bigint AS r_held, 0::bigint AS r_unsettled
                  FROM usage_ledger l CROSS JOIN LATERAL ledger_rollup_part(l) p
                UNION ALL
                SELECT r.company_id, r.bucket, r.period_id, r.feature, r.model, 0, 0, 0, 0, 0, 0, r.calls, r.units,
                       r.input_tokens + r.output_tokens + r.cache_write_tokens + r.cache_read_tokens, r.cost_micros,
                       r.held_micros, r.unsettled
                  FROM usage_rollups_all r
                 WHERE NOT EXISTS (SELECT 1 FROM ledger_dropped_months d
                                    WHERE d.month = date_trunc('month', r.bucket AT TIME ZONE 'UTC')::date)),
            compared AS (
                SELECT company_id, period_id, bucket, feature, model,
                       sum(calls)::bigint AS calls, sum(r_calls)::bigint AS r_calls, sum(units)::bigint AS units,
                       sum(r_units)::bigint AS r_units, sum(tokens)::bigint AS tokens, sum(r_tokens)::bigint AS r_tokens,
                       sum(cost_micros)::bigint AS cost, sum(r_cost)::bigint AS r_cost, sum(held_micros)::bigint AS held,
                       sum(r_held)::bigint AS r_held, sum(unsettled)::bigint AS unsettled,
                       sum(r_unsettled)::bigint AS r_unsettled
                  FROM parts GROUP BY company_id, period_id, bucket, feature, model)
            SELECT c.company_id, c.period_id, c.bucket, c.feature, c.model, m.measure, m.rollup, m.ledger
              FROM compared c
             CROSS JOIN LATERAL (VALUES ('rollup_calls', r_calls, calls), ('rollup_units', r_units, units),
                                        ('rollup_tokens', r_tokens, tokens), ('rollup_cost', r_cost, cost),
                                        ('rollup_held', r_held, held), ('rollup_unsettled', r_unsettled, unsettled))
                                        AS m (measure, rollup, ledger)
             WHERE m.rollup <> m.ledger
             ORDER BY c.company_id, c.bucket, c.period_id, c.feature NULLS FIRST, c.model NULLS FIRST, m.measure
            """, logger: logger)
        var out: [Mismatch] = []
        for try await (company, period, bucket, feature, model, measure, rollup, ledger) in rows.decode(
            (UUID, Int64, Date, String?, String?, String, Int64, Int64).self)
        {
            out.append(
                Mismatch(
                    companyID: company, periodID: period, userID: nil, counter: rollup, ledger: ledger, feature: feature,
                    window: "rollup \(Timestamp.format(bucket)) feature \(feature ?? "-") model \(model ?? "-")",
                    measure: Mismatch.Measure(rawValue: measure) ?? .rollupCalls))
        }
        return out
    }
}
