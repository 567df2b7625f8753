-- Gives back what capgate_charge added for a call it then refuses (its rows stay locked until
-- commit): p_units on the feature counters it reached (p_steps, 0..4: company period, company day,
-- user period, user day), then the user's and the company's units and the holds each took
-- (p_user_hold, p_company_hold; 0 when that counter did not take it). Newest first; returns r with
-- every counter as it now stands (the feature windows read again for the refusal's RateLimit fields).
CREATE FUNCTION capgate_give_back(
    r capgate_admitted, p_units integer, p_steps integer, p_company_hold bigint, p_user_hold bigint
) RETURNS capgate_admitted
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_steps >= 4 THEN
        UPDATE user_feature_usage SET used = used - p_units
         WHERE company_id = r.company_id AND user_id = r.user_id AND feature_id = r.feature_id AND span = 'day'
           AND starts_at = r.day_start;
    END IF;
    IF p_steps >= 3 THEN
        UPDATE user_feature_usage SET used = used - p_units
         WHERE company_id = r.company_id AND user_id = r.user_id AND feature_id = r.feature_id AND span = 'period'
           AND starts_at = r.period_start;
    END IF;
    IF p_steps >= 2 THEN
        UPDATE company_feature_usage SET used = used - p_units
         WHERE company_id = r.company_id AND feature_id = r.feature_id AND span = 'day' AND starts_at = r.day_start;
    END IF;
    IF p_steps >= 1 THEN
        UPDATE company_feature_usage SET used = used - p_units
         WHERE company_id = r.company_id AND feature_id = r.feature_id AND span = 'period' AND starts_at = r.period_start;
    END IF;
    UPDATE user_usage SET used = used - p_units, cost_held = cost_held - p_user_hold
     WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id
    RETURNING used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held;
    UPDATE company_usage SET used = used - p_units, cost_held = cost_held - p_company_hold
     WHERE company_id = r.company_id AND period_id = r.period_id
    RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
    IF r.feature_id IS NOT NULL THEN
        SELECT * INTO r.fc_period_used, r.fc_day_used, r.fu_period_used, r.fu_day_used
          FROM capgate_feature_used(r.company_id, r.user_id, r.feature_id, r.period_start, r.day_start);
    END IF;
    RETURN r;
END;
$$;
