-- Step 4's feature counters of capgate_charge, after the company and user counters: the
-- feature's (p_feature) company period, company day, user period and user day counters in that
-- order, each created on its window's first call, each a conditional upsert that takes its row
-- lock and p_units when they fit its limit (r.fc_* and r.fu_* limits; NULL: none). The first that
-- does not fit refuses the call (feature_limit_exceeded, r.feature_refused naming it) and
-- everything this call added is given back (capgate_give_back; t: what the company and user
-- counters took of the hold).
CREATE FUNCTION capgate_charge_features(
    r capgate_admitted, t capgate_charge_step, p_units integer, p_feature text
) RETURNS capgate_admitted
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_step integer := 0;   -- feature counters charged so far (1..4)
BEGIN
    INSERT INTO company_feature_usage AS f (company_id, feature_id, span, starts_at, ends_at, used)
    SELECT r.company_id, p_feature, 'period', r.period_start, r.period_end, p_units
     WHERE r.fc_period_limit IS NULL OR p_units <= r.fc_period_limit
    ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
     WHERE r.fc_period_limit IS NULL OR f.used + p_units <= r.fc_period_limit
    RETURNING f.used INTO r.fc_period_used;
    IF FOUND THEN
        v_step := 1;
        INSERT INTO company_feature_usage AS f (company_id, feature_id, span, starts_at, ends_at, used)
        SELECT r.company_id, p_feature, 'day', r.day_start, r.day_end, p_units
         WHERE r.fc_day_limit IS NULL OR p_units <= r.fc_day_limit
        ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
         WHERE r.fc_day_limit IS NULL OR f.used + p_units <= r.fc_day_limit
        RETURNING f.used INTO r.fc_day_used;
    END IF;
    IF FOUND AND v_step = 1 THEN
        v_step := 2;
        INSERT INTO user_feature_usage AS f (company_id, user_id, feature_id, span, starts_at, ends_at, used)
        SELECT r.company_id, r.user_id, p_feature, 'period', r.period_start, r.period_end, p_units
         WHERE r.fu_period_limit IS NULL OR p_units <= r.fu_period_limit
        ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
         WHERE r.fu_period_limit IS NULL OR f.used + p_units <= r.fu_period_limit
        RETURNING f.used INTO r.fu_period_used;
    END IF;
    IF FOUND AND v_step = 2 THEN
        v_step := 3;
        INSERT INTO user_feature_usage AS f (company_id, user_id, feature_id, span, starts_at, ends_at, used)
        SELECT r.company_id, r.user_id, p_feature, 'day', r.day_start, r.day_end, p_units
         WHERE r.fu_day_limit IS NULL OR p_units <= r.fu_day_limit
        ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
         WHERE r.fu_day_limit IS NULL OR f.used + p_units <= r.fu_day_limit
        RETURNING f.used INTO r.fu_day_used;
        IF FOUND THEN
            v_step := 4;
        END IF;
    END IF;
    IF v_step < 4 THEN
        r.feature_refused := (ARRAY['company.period', 'company.day', 'user.period', 'user.day'])[v_step + 1];
        r := capgate_give_back(r, p_units, v_step, t.c_hold, CASE WHEN t.u_short THEN 0 ELSE t.hold END);
        r.decision := 'feature_limit_exceeded';
        RETURN r;
    END IF;
    RETURN r;
END;
$$;
