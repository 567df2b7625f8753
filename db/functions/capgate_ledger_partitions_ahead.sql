-- Makes the ledger's monthly partitions ahead of the calls that will need them (issue #50 item
-- 1; docs/ledger.md): the UTC month containing p_at and the p_months after it, each one that is
-- missing, named usage_ledger_pYYYYMM and holding [its first instant, the next month's) as 0026
-- made them. Returns the names it made (none when every month was there).
--
-- Called by the gateway at start and every hour (months: 2, so a running gateway always has the
-- next two months), by `capgate rollover` and by the tests. A call never finds its month missing
-- while these run; if they did not run for months, its row goes to usage_ledger_default and moves
-- out when its month is made here.
--
-- How a month is made, without blocking the calls: a plain table LIKE the ledger, then ATTACH
-- PARTITION, which takes SHARE UPDATE EXCLUSIVE on usage_ledger (CREATE TABLE ... PARTITION OF
-- would take ACCESS EXCLUSIVE and queue every admission behind the longest read of the ledger).
-- ATTACH also scans usage_ledger_default for rows of the new month under ACCESS EXCLUSIVE, so
-- that partition is locked first and any row of the month in it is moved into the new table
-- before the attach. Locks wait at most 1 s (lock_timeout, this transaction only; the gateway's
-- statements are cut at database.timeout, 5 s by default): a run that cannot have them fails with
-- lock_not_available and the next run (an hour later) tries again, with two months of margin. Two
-- runs at once meet at the first lock and the later one finds the months made. Moving many rows
-- out of usage_ledger_default can take longer than the gateway allows: `capgate rollover` has no
-- such limit.
CREATE FUNCTION capgate_ledger_partitions_ahead(p_months integer, p_at timestamptz DEFAULT clock_timestamp())
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_first timestamp := date_trunc('month', p_at AT TIME ZONE 'UTC');  -- the month's first instant, UTC wall clock
    v_month timestamp;
    v_name text;
    v_locked boolean := false;
    v_columns text;
BEGIN
    IF p_months IS NULL OR p_months < 0 OR p_months > 120 OR p_at IS NULL THEN
        RAISE EXCEPTION 'capgate_ledger_partitions_ahead: months must be 0 to 120 and the time given, not % and %',
            p_months, p_at USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('usage_ledger') AND relkind = 'p') THEN
        RAISE EXCEPTION 'usage_ledger is not partitioned (migration 0026_ledger_partitions not applied)'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    FOR k IN 0..p_months LOOP
        v_month := v_first + k * interval '1 month';
        v_name := 'usage_ledger_p' || to_char(v_month, 'YYYYMM');
        CONTINUE WHEN to_regclass(v_name) IS NOT NULL;
        IF NOT v_locked THEN
            PERFORM set_config('lock_timeout', '1s', true);
            LOCK TABLE usage_ledger IN SHARE UPDATE EXCLUSIVE MODE;
            IF to_regclass('usage_ledger_default') IS NOT NULL THEN
                LOCK TABLE usage_ledger_default IN ACCESS EXCLUSIVE MODE;
            END IF;
            v_locked := true;
            SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO v_columns
              FROM pg_attribute WHERE attrelid = 'usage_ledger'::regclass AND attnum > 0 AND NOT attisdropped;
            CONTINUE WHEN to_regclass(v_name) IS NOT NULL;  -- made by a run we waited for
        END IF;
        EXECUTE format('CREATE TABLE %I (LIKE usage_ledger INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                       v_name);
        IF to_regclass('usage_ledger_default') IS NOT NULL THEN
            EXECUTE format('WITH moved AS (DELETE FROM usage_ledger_default WHERE created_at >= $1 AND created_at < $2 '
                           || 'RETURNING %s) INSERT INTO %I (%s) SELECT %s FROM moved',
                           v_columns, v_name, v_columns, v_columns)
              USING v_month AT TIME ZONE 'UTC', (v_month + interval '1 month') AT TIME ZONE 'UTC';
        END IF;
        EXECUTE format('ALTER TABLE usage_ledger ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                       v_name, v_month AT TIME ZONE 'UTC', (v_month + interval '1 month') AT TIME ZONE 'UTC');
        RETURN NEXT v_name;
    END LOOP;
END;
$$;
