-- Recomputes the ledger's rollups (migration 0028) from the rows the ledger holds, for the months
-- it holds: the repair when `capgate verify` reports a rollup mismatch (docs/ledger.md#rollups),
-- and what the benchmark runs after turning the rollup triggers off and on. The months retention
-- dropped keep their rollups (their rows are gone). Locks the ledger against writes (SHARE) for
-- the time of one pass over it; returns the rollup rows written.
CREATE FUNCTION capgate_rollup_rebuild() RETURNS bigint
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_rows bigint;
BEGIN
    LOCK TABLE usage_ledger IN SHARE MODE;
    LOCK TABLE usage_rollups, usage_rollup_changes IN EXCLUSIVE MODE;
    DELETE FROM usage_rollup_changes r
     WHERE NOT EXISTS (SELECT 1 FROM ledger_dropped_months d WHERE d.month = date_trunc('month', r.bucket AT TIME ZONE 'UTC')::date);
    DELETE FROM usage_rollups r
     WHERE NOT EXISTS (SELECT 1 FROM ledger_dropped_months d WHERE d.month = date_trunc('month', r.bucket AT TIME ZONE 'UTC')::date);
    INSERT INTO usage_rollups
    SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
           sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros), sum(p.held_micros),
           sum(p.unsettled)
      FROM usage_ledger l CROSS JOIN LATERAL ledger_rollup_part(l) p
     WHERE NOT EXISTS (SELECT 1 FROM ledger_dropped_months d WHERE d.month = date_trunc('month', p.bucket AT TIME ZONE 'UTC')::date)
     GROUP BY 1, 2, 3, 4, 5
    ON CONFLICT (company_id, bucket, period_id, feature, model) DO UPDATE
       SET calls = usage_rollups.calls + excluded.calls, units = usage_rollups.units + excluded.units,
           input_tokens = usage_rollups.input_tokens + excluded.input_tokens,
           output_tokens = usage_rollups.output_tokens + excluded.output_tokens,
           cache_write_tokens = usage_rollups.cache_write_tokens + excluded.cache_write_tokens,
           cache_read_tokens = usage_rollups.cache_read_tokens + excluded.cache_read_tokens,
           cost_micros = usage_rollups.cost_micros + excluded.cost_micros,
           held_micros = usage_rollups.held_micros + excluded.held_micros,
           unsettled = usage_rollups.unsettled + excluded.unsettled;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END;
$$;
