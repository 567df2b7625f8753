-- The rollups count unsettled charges too (issue #50: no read of the whole ledger). A charged row
-- whose settlement has not come (settled_at NULL) is one `unsettled` in its rollup row; the
-- settlement, `capgate unsettled keep` or a refund takes it out again, in the same statement's
-- trigger run as every other rollup column. So `/metrics`' unsettled count, `capgate unsettled`
-- and `capgate verify`'s unsettled report find the few quarter hours that hold an unsettled charge
-- past the grace time from the rollups (a partial index holds only those), and read the ledger
-- rows of those quarter hours only, instead of every row the ledger holds.

-- First the ledger's lock, against writes until this migration commits: taken after the rollup
-- tables' it would deadlock with a writer whose trigger waits for them.
LOCK TABLE usage_ledger IN SHARE MODE;

-- The compaction and the rebuild of before this migration would write rollups without the new
-- column (losing the changes' counts): gone until the function set that follows this migration
-- makes them again. A gateway's compaction job meanwhile fails and tries again 5 s later.
DROP FUNCTION IF EXISTS capgate_rollup_compact();
DROP FUNCTION IF EXISTS capgate_rollup_rebuild();

ALTER TABLE usage_rollups ADD COLUMN unsettled bigint NOT NULL DEFAULT 0;
ALTER TABLE usage_rollup_changes ADD COLUMN unsettled bigint NOT NULL DEFAULT 0;
CREATE INDEX usage_rollups_unsettled ON usage_rollups (bucket) WHERE unsettled <> 0;

CREATE OR REPLACE VIEW usage_rollups_all AS
SELECT * FROM usage_rollups
UNION ALL
SELECT * FROM usage_rollup_changes;

-- ledger_rollup_part with the new column (its result type changes: dropped and made again; the
-- trigger function below and the functions of db/functions name it by its text only).
DROP FUNCTION ledger_rollup_part(usage_ledger, integer);
CREATE FUNCTION ledger_rollup_part(l usage_ledger, sign integer DEFAULT 1)
RETURNS TABLE (company_id uuid, bucket timestamptz, period_id bigint, feature text, model text, calls bigint,
               units bigint, input_tokens bigint, output_tokens bigint, cache_write_tokens bigint,
               cache_read_tokens bigint, cost_micros bigint, held_micros bigint, unsettled bigint)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT l.company_id, date_bin('15 minutes', l.created_at, timestamptz '2000-01-01 00:00:00+00'), l.period_id,
           l.feature, l.model, sign::bigint, sign * l.units::bigint, sign * coalesce(l.input_tokens, 0),
           sign * coalesce(l.output_tokens, 0),
           sign * (coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0)),
           sign * coalesce(l.cache_read_tokens, 0),
           sign * CASE WHEN l.cost_source IS NOT NULL THEN coalesce(l.cost_micros, 0) ELSE 0 END,
           sign * CASE WHEN l.cost_source IS NULL THEN coalesce(l.hold_micros, 0) ELSE 0 END,
           sign * CASE WHEN l.settled_at IS NULL THEN 1 ELSE 0 END::bigint
     WHERE l.outcome = 'charged'
$$;

CREATE OR REPLACE FUNCTION capgate_ledger_rollup() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) p
         GROUP BY 1, 2, 3, 4, 5;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM (SELECT q.* FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) q
                UNION ALL
                SELECT q.* FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) q) p
         GROUP BY 1, 2, 3, 4, 5
        HAVING sum(p.calls) <> 0 OR sum(p.units) <> 0 OR sum(p.input_tokens) <> 0 OR sum(p.output_tokens) <> 0
            OR sum(p.cache_write_tokens) <> 0 OR sum(p.cache_read_tokens) <> 0 OR sum(p.cost_micros) <> 0
            OR sum(p.held_micros) <> 0 OR sum(p.unsettled) <> 0;
    ELSE
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) p
         GROUP BY 1, 2, 3, 4, 5;
    END IF;
    RETURN NULL;
END;
$$;

-- The unsettled charges the ledger holds now, counted into their rollups (the lock at the top
-- keeps every writer out until this migration commits; the triggers count every later change).
INSERT INTO usage_rollup_changes (company_id, bucket, period_id, feature, model, calls, units, input_tokens,
                                  output_tokens, cache_write_tokens, cache_read_tokens, cost_micros, held_micros,
                                  unsettled)
SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, 0, 0, 0, 0, 0, 0, 0, 0, sum(p.unsettled)
  FROM usage_ledger l CROSS JOIN LATERAL ledger_rollup_part(l) p
 WHERE l.outcome = 'charged' AND l.settled_at IS NULL
 GROUP BY 1, 2, 3, 4, 5;
