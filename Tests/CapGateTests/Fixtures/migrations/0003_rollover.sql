-- The monthly rollover in SQL, so that `capgate rollover`, the server's schedule and pg_cron
-- all run the same code.
--
-- Period k of an anchor is [anchor + k months, anchor + (k+1) months). PostgreSQL adds months
-- to a date by clamping to the last day of the target month, and every bound is computed
-- from the anchor (never chained), so an anchor on Jan 31 10:00 gives Feb 28/29 10:00, then
-- Mar 31 10:00. The calendar is UTC, whatever the session's time zone.

CREATE FUNCTION capgate_period_bound(p_anchor timestamptz, p_months integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET timezone = 'UTC' AS $$
    SELECT p_anchor + make_interval(months => p_months)
$$;

-- Moves one company whose period has ended into the period containing p_at.
-- Returns none | renewed | to_default | no_plan. Locks the company row first.
CREATE FUNCTION capgate_roll_company(p_company uuid, p_at timestamptz) RETURNS text
LANGUAGE plpgsql SET timezone = 'UTC' AS $$
DECLARE
    v_latest plan_periods%ROWTYPE;
    v_renew boolean;
    v_plan text;
    v_interval text;
    v_step integer;
    v_k integer;
    v_start timestamptz;
    v_end timestamptz;
    v_period bigint;
BEGIN
    PERFORM 1 FROM companies WHERE id = p_company FOR UPDATE;
    SELECT * INTO v_latest FROM plan_periods WHERE company_id = p_company ORDER BY started_at DESC LIMIT 1;
    IF NOT FOUND OR v_latest.ends_at > p_at THEN
        RETURN 'none';
    END IF;

    v_renew := v_latest.auto_renew AND v_latest.status NOT IN ('expired', 'cancelled');
    IF v_renew THEN
        v_plan := v_latest.plan_id;
        v_interval := v_latest.interval;
    ELSE
        SELECT id INTO v_plan FROM plans WHERE is_default LIMIT 1;
        v_interval := 'month';
        IF v_plan IS NULL THEN
            -- No default plan: no active plan until one is assigned. Recorded once.
            IF v_latest.status = 'expired' THEN
                RETURN 'none';
            END IF;
            UPDATE plan_periods SET status = 'expired' WHERE company_id = p_company AND id = v_latest.id;
            INSERT INTO billing_events (company_id, type, plan_id, payload)
            VALUES (p_company, 'rollover_no_plan', NULL,
                    jsonb_build_object('from_plan', v_latest.plan_id, 'at', p_at));
            RETURN 'no_plan';
        END IF;
    END IF;

    -- The period of the anchor that contains p_at: start from the month difference, adjust.
    v_step := CASE WHEN v_interval = 'year' THEN 12 ELSE 1 END;
    v_k := ((extract(year FROM p_at)::int - extract(year FROM v_latest.anchor)::int) * 12
            + extract(month FROM p_at)::int - extract(month FROM v_latest.anchor)::int) / v_step;
    LOOP
        v_start := capgate_period_bound(v_latest.anchor, v_k * v_step);
        v_end := capgate_period_bound(v_latest.anchor, (v_k + 1) * v_step);
        IF p_at < v_start THEN
            v_k := v_k - 1;
        ELSIF p_at >= v_end THEN
            v_k := v_k + 1;
        ELSE
            EXIT;
        END IF;
    END LOOP;
    -- A period that ended off the anchor's grid (a store expiration date) is not overlapped.
    v_start := greatest(v_start, v_latest.ends_at);

    INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, interval, auto_renew, source)
    VALUES (p_company, v_plan, v_start, v_end, v_latest.anchor, v_interval, true, 'rollover')
    RETURNING id INTO v_period;
    INSERT INTO company_usage (company_id, period_id, used) VALUES (p_company, v_period, 0);
    INSERT INTO billing_events (company_id, type, plan_id, payload)
    VALUES (p_company, CASE WHEN v_renew THEN 'rollover' ELSE 'rollover_to_default' END, v_plan,
            jsonb_build_object('from_plan', v_latest.plan_id, 'to_plan', v_plan, 'start', v_start, 'end', v_end, 'at', p_at));
    RETURN CASE WHEN v_renew THEN 'renewed' ELSE 'to_default' END;
END;
$$;

-- Every company at once, in one transaction, under the same advisory lock as `capgate rollover`
-- (for pg_cron: SELECT * FROM capgate_rollover();).
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
    RETURN NEXT;
END;
$$;
