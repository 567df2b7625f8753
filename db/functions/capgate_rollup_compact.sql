-- Moves the ledger's rollup changes (usage_rollup_changes, appended by the ledger's statement
-- triggers, migration 0028) into usage_rollups, summed per key, and returns how many changes it
-- moved. Every gateway runs it every few seconds; one at a time (an advisory lock, this
-- transaction only: a run that finds another under way returns 0 and leaves the changes to it).
-- Only the changes this run's snapshot sees are moved: a change committed meanwhile stays for the
-- next run. A read that sums both tables in one statement sees each change once, before or after.
-- Rollup rows are written in key order, so two runs could never deadlock even without the lock.
CREATE FUNCTION capgate_rollup_compact() RETURNS bigint
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_moved bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('capgate_rollup_compact')) THEN
        RETURN 0;
    END IF;
    WITH moved AS (DELETE FROM usage_rollup_changes RETURNING *),
    counted AS (SELECT count(*) AS n FROM moved),
    merged AS (
        INSERT INTO usage_rollups AS r
        SELECT m.company_id, m.bucket, m.period_id, m.feature, m.model, sum(m.calls), sum(m.units), sum(m.input_tokens),
               sum(m.output_tokens), sum(m.cache_write_tokens), sum(m.cache_read_tokens), sum(m.cost_micros),
               sum(m.held_micros), sum(m.unsettled)
          FROM moved m
         GROUP BY 1, 2, 3, 4, 5
         ORDER BY 1, 2, 3, 4, 5
        ON CONFLICT (company_id, bucket, period_id, feature, model) DO UPDATE
           SET calls = r.calls + excluded.calls, units = r.units + excluded.units,
               input_tokens = r.input_tokens + excluded.input_tokens, output_tokens = r.output_tokens + excluded.output_tokens,
               cache_write_tokens = r.cache_write_tokens + excluded.cache_write_tokens,
               cache_read_tokens = r.cache_read_tokens + excluded.cache_read_tokens,
               cost_micros = r.cost_micros + excluded.cost_micros, held_micros = r.held_micros + excluded.held_micros,
               unsettled = r.unsettled + excluded.unsettled
        RETURNING 1)
    SELECT n INTO v_moved FROM counted;
    RETURN v_moved;
END;
$$;
