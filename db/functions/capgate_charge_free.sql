-- A call of capgate_charge that no counter takes: a free route (p_units = 0) is in the ledger,
-- counted against nothing, held nothing (charged); a feature not in the plan is refused (r.decision
-- feature_not_in_plan, from capgate_charge_read), its 402's usage showing the counters as they
-- stand (SPEC §3). Either way r answers the company's and the user's counters, unchanged.
CREATE FUNCTION capgate_charge_free(
    r capgate_admitted, p_method text, p_route text, p_model text, p_feature text, p_request_id text, p_at timestamptz
) RETURNS capgate_admitted
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    SELECT used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held
      FROM company_usage WHERE company_id = r.company_id AND period_id = r.period_id;
    SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
     WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id;
    r.company_used := coalesce(r.company_used, 0);
    r.user_used := coalesce(r.user_used, 0);
    r.cc_used := coalesce(r.cc_used, 0);
    r.cc_held := coalesce(r.cc_held, 0);
    r.uc_used := coalesce(r.uc_used, 0);
    r.uc_held := coalesce(r.uc_held, 0);
    IF r.decision = 'feature_not_in_plan' THEN
        RETURN r;
    END IF;
    INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature,
                              request_id, outcome, created_at)
    VALUES (r.company_id, r.period_id, r.user_id, 0, p_method, p_route, p_model, p_feature, p_request_id, 'charged', p_at)
    RETURNING id INTO r.ledger_id;
    r.decision := 'charged';
    RETURN r;
END;
$$;
