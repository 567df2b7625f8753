-- Rollups of the ledger (issue #50 item 3; docs/ledger.md#rollups): the console's daily chart and
-- the per-model read sum the charged rows of a company's quarter hours instead of its calls, so
-- they cost O(days), not O(calls), whatever the ledger holds.
--
-- A rollup row sums the charged ledger rows of one company, quarter hour (UTC, the call's
-- created_at down to :00, :15, :30 or :45), plan period, feature and model. Every zone's midnight
-- falls on a quarter hour (offsets are multiples of 15 minutes), so a company's day in any zone,
-- and after a change of its zone, is a whole number of quarter hours; a period is a key, so a
-- period starting mid-quarter is still read exactly.
--
-- Kept exactly, in the transaction of every change: statement triggers on usage_ledger (one run
-- per INSERT, UPDATE or DELETE statement, however many rows it touched: an admission batch, a
-- settlement batch, a refund) add what the statement changed, new rows' parts less old rows',
-- grouped by key, to usage_rollup_changes: appended, never updated, no index, so no two
-- statements wait for each other there and an admission pays one small insert a batch. A
-- compaction (capgate_rollup_compact, a job of every gateway, one at a time) moves the changes
-- into usage_rollups; a read sums both tables in one statement (one snapshot: a change is in one
-- or the other). Retention's drop of a month (DETACH, DROP) fires no trigger: the rollups keep
-- the dropped months, and `capgate verify` checks them against the months still held.
--
-- What a row adds is written once, here: ledger_rollup_part. The trigger, the backfill below and
-- `capgate verify` use it. It and the trigger function live in this migration, not in
-- db/functions, since the backfill needs them before the function set runs, and a trigger
-- function re-created there would leave the triggers calling a stub between the two.

CREATE TABLE usage_rollups (
    company_id uuid NOT NULL,
    bucket timestamptz NOT NULL,
    period_id bigint NOT NULL,
    feature text,
    model text,
    calls bigint NOT NULL,
    units bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_write_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    -- SPEC §11 as `capgate verify` counts cost: a row's cost once it has a cost_source, its hold
    -- while it has none.
    cost_micros bigint NOT NULL,
    held_micros bigint NOT NULL
);
CREATE UNIQUE INDEX usage_rollups_key ON usage_rollups (company_id, bucket, period_id, feature, model) NULLS NOT DISTINCT;

-- What ledger statements changed since the last compaction: the same columns, signed.
CREATE TABLE usage_rollup_changes (LIKE usage_rollups);

-- One ledger row's part of its rollup row: zero for a row that is not charged.
CREATE FUNCTION ledger_rollup_part(l usage_ledger, sign integer DEFAULT 1)
RETURNS TABLE (company_id uuid, bucket timestamptz, period_id bigint, feature text, model text, calls bigint,
               units bigint, input_tokens bigint, output_tokens bigint, cache_write_tokens bigint,
               cache_read_tokens bigint, cost_micros bigint, held_micros bigint)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT l.company_id, date_bin('15 minutes', l.created_at, timestamptz '2000-01-01 00:00:00+00'), l.period_id,
           l.feature, l.model, sign::bigint, sign * l.units::bigint, sign * coalesce(l.input_tokens, 0),
           sign * coalesce(l.output_tokens, 0),
           sign * (coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0)),
           sign * coalesce(l.cache_read_tokens, 0),
           sign * CASE WHEN l.cost_source IS NOT NULL THEN coalesce(l.cost_micros, 0) ELSE 0 END,
           sign * CASE WHEN l.cost_source IS NULL THEN coalesce(l.hold_micros, 0) ELSE 0 END
     WHERE l.outcome = 'charged'
$$;

-- The statement triggers' function: the statement's new rows' parts less its old rows', per key,
-- keys whose sums did not move left out (a settlement that only records the upstream status).
CREATE FUNCTION capgate_ledger_rollup() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros)
          FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) p
         GROUP BY 1, 2, 3, 4, 5;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros)
          FROM (SELECT q.* FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) q
                UNION ALL
                SELECT q.* FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) q) p
         GROUP BY 1, 2, 3, 4, 5
        HAVING sum(p.calls) <> 0 OR sum(p.units) <> 0 OR sum(p.input_tokens) <> 0 OR sum(p.output_tokens) <> 0
            OR sum(p.cache_write_tokens) <> 0 OR sum(p.cache_read_tokens) <> 0 OR sum(p.cost_micros) <> 0
            OR sum(p.held_micros) <> 0;
    ELSE
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros)
          FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) p
         GROUP BY 1, 2, 3, 4, 5;
    END IF;
    RETURN NULL;
END;
$$;

-- CREATE TRIGGER locks the ledger against writes until this migration commits: the backfill
-- below reads a ledger no one changes, and every later change goes through the triggers.
CREATE TRIGGER usage_ledger_rollup_insert AFTER INSERT ON usage_ledger
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();
CREATE TRIGGER usage_ledger_rollup_update AFTER UPDATE ON usage_ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();
CREATE TRIGGER usage_ledger_rollup_delete AFTER DELETE ON usage_ledger
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();

INSERT INTO usage_rollups
SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
       sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros), sum(p.held_micros)
  FROM usage_ledger l CROSS JOIN LATERAL ledger_rollup_part(l) p
 GROUP BY 1, 2, 3, 4, 5;

-- What the reads sum: the compacted rollups and the changes not yet compacted (a read's filter on
-- company and quarter hour reaches both).
CREATE VIEW usage_rollups_all AS
SELECT * FROM usage_rollups
UNION ALL
SELECT * FROM usage_rollup_changes;
