-- Steps 2 and 3 of capgate_charge: the period containing p_at, locked FOR KEY SHARE before any
-- counter (none: the company is moved into it first as `capgate rollover` would; capgate_roll_company
-- locks the company row, so concurrent calls at the boundary open one period), the plan, the user
-- and p_feature with its entitlement, into r (whose company_id and user_id say who calls).
-- Refuses (r.decision) no_active_plan, unknown_user (unknown or disabled); for p_feature
-- (NULL: none), unknown_feature (unknown or inactive), feature_not_bound (not one of p_bound, the
-- features a bound credential may be charged to; NULL: unbound), feature_not_in_plan (no
-- entitlement in the plan, or not enabled). The entitlement's limits and day are set only when it
-- is enabled.
CREATE FUNCTION capgate_charge_read(r capgate_admitted, p_at timestamptz, p_feature text, p_bound text[])
RETURNS capgate_admitted
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_user_found boolean;
    v_zone text;
    v_active boolean;
    e plan_features%ROWTYPE;
BEGIN
    FOR pass IN 1..2 LOOP
        SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at, pl.monthly_company_cap,
               coalesce(u.monthly_cap, pl.monthly_user_cap), u.id IS NOT NULL, c.time_zone,
               pl.monthly_company_budget, coalesce(u.monthly_budget, pl.monthly_user_budget),
               pl.company_rpm, pl.company_tpm, pl.user_rpm, pl.user_tpm, pl.user_concurrency
          INTO r.period_id, r.plan_id, r.plan_name, r.period_start, r.period_end, r.company_cap, r.user_cap,
               v_user_found, v_zone, r.cc_limit, r.uc_limit,
               r.company_rpm, r.company_tpm, r.user_rpm, r.user_tpm, r.user_concurrency
          FROM plan_periods pp
          JOIN plans pl ON pl.id = pp.plan_id
          JOIN companies c ON c.id = pp.company_id
          LEFT JOIN users u ON u.company_id = pp.company_id AND u.id = r.user_id AND NOT u.disabled
         WHERE pp.company_id = r.company_id AND pp.started_at <= p_at AND pp.ends_at > p_at
           FOR KEY SHARE OF pp;
        EXIT WHEN FOUND OR pass = 2;
        PERFORM capgate_roll_company(r.company_id, p_at);
    END LOOP;
    IF r.period_id IS NULL THEN
        r.decision := 'no_active_plan';
        RETURN r;
    END IF;
    IF NOT v_user_found THEN
        r.user_cap := NULL;
        r.uc_limit := NULL;
        r.decision := 'unknown_user';
        RETURN r;
    END IF;

    IF p_feature IS NOT NULL THEN
        r.feature_id := p_feature;
        SELECT f.name, f.is_active INTO r.feature_name, v_active FROM features f WHERE f.id = p_feature;
        IF NOT coalesce(v_active, false) THEN
            r.decision := 'unknown_feature';
            RETURN r;
        END IF;
        IF p_bound IS NOT NULL AND NOT (p_feature = ANY (p_bound)) THEN
            r.decision := 'feature_not_bound';
            RETURN r;
        END IF;
        SELECT * INTO e FROM plan_features WHERE plan_id = r.plan_id AND feature_id = p_feature;
        r.feature_message := e.message;
        r.f_company_rpm := e.company_rpm;
        r.f_company_tpm := e.company_tpm;
        r.f_user_rpm := e.user_rpm;
        r.f_user_tpm := e.user_tpm;
        r.f_user_concurrency := e.user_concurrency;
        IF NOT coalesce(e.enabled, false) THEN
            r.decision := 'feature_not_in_plan';
        ELSE
            r.day_start := capgate_day_start(p_at, v_zone);
            r.day_end := capgate_day_end(p_at, v_zone);
            r.fc_period_limit := e.period_limit;
            r.fc_day_limit := e.daily_limit;
            r.fu_period_limit := e.user_period_limit;
            r.fu_day_limit := e.user_daily_limit;
        END IF;
    END IF;
    RETURN r;
END;
$$;
