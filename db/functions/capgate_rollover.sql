-- Every company at once, in one transaction, under the same advisory lock as `capgate rollover`
-- (for pg_cron: SELECT * FROM capgate_rollover();). Then the ledger's partitions of the current
-- month and the two after it are made if missing (capgate_ledger_partitions_ahead), as `capgate
-- rollover` does; a lock it cannot have within its second leaves them to the next run (a warning),
-- never undoes the rollover.
CREATE FUNCTION capgate_rollover(p_at timestamptz DEFAULT now())
RETURNS TABLE (moved integer, to_default integer, without_plan integer, unchanged integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_company uuid;
    v_change text;
BEGIN
    moved := 0; to_default := 0; without_plan := 0; unchanged := 0;
    PERFORM pg_advisory_xact_lock(4855285325162112258); -- BillingStore.rolloverLockKey
    FOR v_company IN SELECT id FROM companies ORDER BY id LOOP
        v_change := capgate_roll_company(v_company, p_at);
        IF v_change = 'renewed' THEN
            moved := moved + 1;
        ELSIF v_change = 'to_default' THEN
            moved := moved + 1;
            to_default := to_default + 1;
        ELSIF v_change = 'no_plan' THEN
            without_plan := without_plan + 1;
        ELSE
            unchanged := unchanged + 1;
        END IF;
    END LOOP;
    BEGIN
        PERFORM capgate_ledger_partitions_ahead(2);
    EXCEPTION WHEN lock_not_available THEN
        RAISE WARNING 'ledger partitions not made (a lock was busy): the next rollover tries again';
    END;
    RETURN NEXT;
END;
$$;
