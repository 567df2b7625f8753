-- Steps 7 and 8 of capgate_charge, once the counters and the feature's took the call (r, t:
-- what they took): 3a. the top-up grants that pay what the company cap or budget could not hold,
-- locked (capgate_grant_take; read only when the user's budget refuses the call anyway; a grant a
-- concurrent call emptied since the peek: company_cap after all); 3b. the budgets, company
-- (unless a grant holds the call) then user (budget_exceeded, r.budget_scope); 3b'. the rate
-- windows (capgate_rate_take: rate_limited, r.rate_refused); 3c. the grants taken, the last step
-- that changes a counter: their part of the units leaves the company counter (their part of the
-- hold never entered it). A refusal gives back everything this call added (capgate_give_back).
CREATE FUNCTION capgate_charge_grants(
    INOUT r capgate_admitted, INOUT t capgate_charge_step, p_units integer, p_at timestamptz, p_feature text,
    p_ended bigint[]
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_rate capgate_rate;
    v_taken boolean;
BEGIN
    -- 3a. top-ups (7): the grants that pay what the company could not hold, locked (read only when
    --     the user's budget refuses the call anyway)
    IF t.g_units OR t.c_short THEN
        SELECT g.units_grant, g.cost_grant, g.taken INTO t.units_grant, t.cost_grant, v_taken
          FROM capgate_grant_take(r.company_id, p_at, CASE WHEN t.g_units THEN t.g_part END,
                                  CASE WHEN t.c_short THEN t.hold - t.c_hold END,
                                  CASE WHEN t.u_short THEN 'peek' ELSE 'lock' END) g;
        IF t.g_units AND t.units_grant IS NULL THEN
            -- A concurrent call took what was left since step 1: the company cap refuses after all.
            r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                                   t.c_hold, CASE WHEN t.u_short THEN 0 ELSE t.hold END);
            r.decision := 'company_cap';
            RETURN;
        END IF;
    END IF;

    -- 3b. the budgets: company (unless a grant holds the call), then user (SPEC §11)
    IF (t.c_short AND t.cost_grant IS NULL) OR t.u_short THEN
        r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                               t.c_hold, CASE WHEN t.u_short THEN 0 ELSE t.hold END);
        r.budget_scope := CASE WHEN t.c_short AND t.cost_grant IS NULL THEN 'company' ELSE 'user' END;
        r.decision := 'budget_exceeded';
        RETURN;
    END IF;

    -- 3b'. the rate windows (8): a refusal gives back what the counters took (the part of a hold
    --      a grant holds never entered the company counter: t.c_hold)
    IF t.rated THEN
        v_rate := capgate_rate_take(r.company_id, r.period_id, r.period_start, r.user_id, p_at, r.rate_tokens,
                                    r.company_rpm, r.company_tpm, r.user_rpm, r.user_tpm, r.user_concurrency, p_feature,
                                    r.f_company_rpm, r.f_company_tpm, r.f_user_rpm, r.f_user_tpm, r.f_user_concurrency,
                                    p_ended);
        r.rate_minute := v_rate.minute;
        r.cr_calls := v_rate.c_calls;
        r.cr_tokens := v_rate.c_tokens;
        r.ur_calls := v_rate.u_calls;
        r.ur_tokens := v_rate.u_tokens;
        r.u_slots := v_rate.u_slots;
        r.fcr_calls := v_rate.fc_calls;
        r.fcr_tokens := v_rate.fc_tokens;
        r.fur_calls := v_rate.fu_calls;
        r.fur_tokens := v_rate.fu_tokens;
        r.fu_slots := v_rate.fu_slots;
        t.scopes := v_rate.scopes;
        IF v_rate.refused IS NOT NULL THEN
            r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                                   t.c_hold, CASE WHEN t.u_short THEN 0 ELSE t.hold END);
            r.rate_refused := v_rate.refused;
            r.decision := 'rate_limited';
            RETURN;
        END IF;
    END IF;

    -- 3c. top-ups (7): the grants locked in 3a are taken, the last step that changes a counter
    IF t.units_grant IS NOT NULL OR t.cost_grant IS NOT NULL THEN
        SELECT g.units_grant, g.cost_grant, g.taken INTO t.units_grant, t.cost_grant, v_taken
          FROM capgate_grant_take(r.company_id, p_at, CASE WHEN t.g_units THEN t.g_part END,
                                  CASE WHEN t.c_short THEN t.hold - t.c_hold END,
                                  'take') g;
        IF NOT v_taken THEN
            RAISE EXCEPTION 'capgate_charge: a top-up grant locked for this call was not found again';
        END IF;
        IF t.g_units THEN
            UPDATE company_usage SET used = used - t.g_part WHERE company_id = r.company_id AND period_id = r.period_id
            RETURNING used INTO r.company_used;
        END IF;
    END IF;
END;
$$;
