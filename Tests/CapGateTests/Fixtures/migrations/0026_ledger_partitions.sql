-- The ledger partitioned by month (issue #50 item 1): usage_ledger becomes a table partitioned
-- by range of created_at (the call's time, which every admission writes), one partition a UTC
-- month named usage_ledger_pYYYYMM holding [YYYY-MM-01 00:00 UTC, the next month's first instant),
-- plus usage_ledger_default for a row whose month has no partition (see docs/ledger.md).
--
-- Converted in place, inside this migration's transaction (the migrator runs each file in one):
--   1. the old table, its identity sequence and its indexes are renamed out of the way;
--   2. the partitioned table is made LIKE the old one (the same columns in the same order, their
--      NOT NULLs, defaults and CHECK constraints), with a new identity whose sequence takes the
--      old name (capgate_admit_batch calls nextval('usage_ledger_id_seq')) and goes on from the
--      old one's value, so no id is ever given twice;
--   3. one partition for every month that holds rows, and the current month and the two after it
--      (capgate_ledger_partitions_ahead, db/functions/, keeps making months ahead from now on);
--   4. the rows are copied through the parent (each goes to its month), ids kept;
--   5. the keys and indexes are made on the parent, which makes them on every partition;
--   6. the old table is dropped.
-- Why the rows are moved rather than the old table attached as a partition: a partition holds one
-- range, so the old table could only be one partition spanning every month it holds, which a
-- month's retention could never detach; and its primary key has to change anyway.
-- The copy takes the ledger's size in time, with usage_ledger locked (the rename takes an ACCESS
-- EXCLUSIVE lock): admissions wait for it. docs/ledger.md says how long and what to do.
--
-- The primary key must include the partition key: it is (company_id, id, created_at). What
-- (company_id, id) alone guaranteed, one row per id, holds because ids come only from the identity
-- sequence (GENERATED ALWAYS; the batch takes nextval itself, OVERRIDING SYSTEM VALUE). No foreign
-- key references usage_ledger (usage_ledger_attempts and rate_calls name a ledger id without one),
-- no ON CONFLICT targets it, and usage_ledger_idempotency has not been unique since 0010.
-- Lookups by (company_id, id) use each partition's primary key index: an index scan in every
-- partition, or in one when the row's time is given too (capgate_refund's p_created_at).

ALTER TABLE usage_ledger RENAME TO usage_ledger_0025;
ALTER SEQUENCE usage_ledger_id_seq RENAME TO usage_ledger_0025_id_seq;
ALTER TABLE usage_ledger_0025 RENAME CONSTRAINT usage_ledger_pkey TO usage_ledger_0025_pkey;
DROP INDEX usage_ledger_idempotency;
DROP INDEX usage_ledger_time;
DROP INDEX usage_ledger_feature;

CREATE TABLE usage_ledger (
    LIKE usage_ledger_0025 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMMENTS
) PARTITION BY RANGE (created_at);

-- The sequence goes on where the old one stood (never called: its start, still to be given).
SELECT setval('usage_ledger_id_seq', last_value, is_called) FROM usage_ledger_0025_id_seq;

CREATE TABLE usage_ledger_default PARTITION OF usage_ledger DEFAULT;

DO $$
DECLARE
    v_month timestamptz;
BEGIN
    FOR v_month IN
        SELECT DISTINCT date_trunc('month', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM usage_ledger_0025
        UNION
        SELECT (date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC') + k * interval '1 month') AT TIME ZONE 'UTC'
          FROM generate_series(0, 2) k
        ORDER BY 1
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF usage_ledger FOR VALUES FROM (%L) TO (%L)',
                       'usage_ledger_p' || to_char(v_month AT TIME ZONE 'UTC', 'YYYYMM'), v_month,
                       (v_month AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC');
    END LOOP;
END;
$$;

INSERT INTO usage_ledger OVERRIDING SYSTEM VALUE SELECT * FROM usage_ledger_0025;

ALTER TABLE usage_ledger ADD PRIMARY KEY (company_id, id, created_at);
CREATE INDEX usage_ledger_idempotency ON usage_ledger (company_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX usage_ledger_time ON usage_ledger (company_id, created_at, id);
CREATE INDEX usage_ledger_feature ON usage_ledger (company_id, feature, created_at) WHERE feature IS NOT NULL;

DROP TABLE usage_ledger_0025;

ANALYZE usage_ledger;
