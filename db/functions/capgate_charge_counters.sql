-- Steps 6 and 8's bound, then 4's company and user counters, of capgate_charge. Cost (SPEC §11):
-- a metered call's hold (r.hold: capgate_hold of the price of p_model at p_at and the bound
-- p_prompt, p_max_tokens, p_cache, p_window, whose meaning capgate_hold gives; t.hold as the
-- counters take it, 0 for none). Where a budget applies (the plan's company budget, or the
-- user's), a call that cannot be held is refused before any counter (unbounded_call,
-- unpriced_model, max_tokens_required); where a token window applies (SPEC §14, t.rated: a rate
-- window or a concurrency limit does), a call without a token bound the same way (r.rate_tokens:
-- capgate_rate_tokens', 0 for a call counted without one).
-- Then the company and user counters, in that order (the lock order of every admission): each a
-- conditional update that takes its row lock and p_units with the hold when both fit; else the
-- row (created at zero by the period's first call) is locked and read. The company cap refuses
-- (company_cap) unless a top-up grant can pay the units past it (step 7: t.g_units, t.g_part; the
-- counter then takes them all, the grant's part leaves it when the grant is taken,
-- capgate_charge_grants); a company budget that cannot take the hold takes its room (t.c_short,
-- t.c_hold), decided after the caps and features. The user cap refuses (user_cap) and gives back
-- what the company counter took; a user budget that cannot take the hold is decided later
-- (t.u_short). A refusal answers the feature's counters as they stand (its RateLimit fields).
CREATE FUNCTION capgate_charge_counters(
    INOUT r capgate_admitted, p_units integer, p_at timestamptz, p_feature text, p_model text, p_prompt bigint,
    p_max_tokens bigint, p_cache smallint, p_window bigint, OUT t capgate_charge_step
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_price prices%ROWTYPE;
BEGIN
    -- An empty price book, a caps-only gateway, costs one probe of its index, not the lookup of
    -- every prefix.
    IF p_model IS NOT NULL AND EXISTS (SELECT 1 FROM prices) THEN
        v_price := capgate_price_row(p_model, p_at);
    END IF;
    r.hold := capgate_hold(v_price, p_prompt, p_max_tokens, p_cache, p_window);
    t.hold := coalesce(r.hold, 0);
    t.c_hold := t.hold;
    t.c_short := false;
    t.u_short := false;
    t.g_units := false;
    IF r.cc_limit IS NOT NULL OR r.uc_limit IS NOT NULL THEN
        r.decision := CASE WHEN p_prompt < -1 THEN 'unbounded_call'
                           WHEN v_price.model IS NULL THEN 'unpriced_model'
                           WHEN p_max_tokens < 0 THEN 'max_tokens_required' END;
        IF r.decision IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    t.rated := r.company_rpm IS NOT NULL OR r.company_tpm IS NOT NULL OR r.user_rpm IS NOT NULL
               OR r.user_tpm IS NOT NULL OR r.user_concurrency IS NOT NULL OR r.f_company_rpm IS NOT NULL
               OR r.f_company_tpm IS NOT NULL OR r.f_user_rpm IS NOT NULL OR r.f_user_tpm IS NOT NULL
               OR r.f_user_concurrency IS NOT NULL;
    IF t.rated THEN
        r.rate_tokens := capgate_rate_tokens(v_price, p_prompt, p_max_tokens, p_window);
        IF (r.rate_tokens IS NULL OR v_price.model IS NULL)
           AND (r.company_tpm IS NOT NULL OR r.user_tpm IS NOT NULL OR r.f_company_tpm IS NOT NULL OR r.f_user_tpm IS NOT NULL) THEN
            -- A token window, as a budget, bounds only a priced call (SPEC §11: fail closed).
            r.decision := CASE WHEN p_prompt < -1 THEN 'unbounded_call' WHEN v_price.model IS NULL THEN 'unpriced_model'
                               WHEN p_max_tokens < 0 THEN 'max_tokens_required' ELSE 'unbounded_call' END;
            RETURN;
        END IF;
        r.rate_tokens := coalesce(r.rate_tokens, 0);
    END IF;

    UPDATE company_usage SET used = used + p_units, cost_held = cost_held + t.hold
     WHERE company_id = r.company_id AND period_id = r.period_id
       AND (r.company_cap IS NULL OR used + p_units <= r.company_cap)
       AND (r.cc_limit IS NULL OR cost_used + cost_held + t.hold <= r.cc_limit)
    RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
    IF NOT FOUND THEN
        INSERT INTO company_usage (company_id, period_id, used) VALUES (r.company_id, r.period_id, 0) ON CONFLICT DO NOTHING;
        SELECT used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held FROM company_usage
         WHERE company_id = r.company_id AND period_id = r.period_id FOR UPDATE;
        t.g_part := CASE WHEN r.company_cap IS NOT NULL AND r.company_used + p_units > r.company_cap
                         THEN p_units - greatest(r.company_cap - r.company_used, 0) END;
        t.g_units := t.g_part IS NOT NULL
                     AND (capgate_grant_take(r.company_id, p_at, t.g_part, NULL, 'peek')).units_grant IS NOT NULL;
        IF r.company_cap IS NOT NULL AND r.company_used + p_units > r.company_cap AND NOT t.g_units THEN
            SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
             WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id;
            r.user_used := coalesce(r.user_used, 0);
            r.uc_used := coalesce(r.uc_used, 0);
            r.uc_held := coalesce(r.uc_held, 0);
            IF p_feature IS NOT NULL THEN
                -- The feature's windows as they stand, for the refusal's RateLimit fields.
                SELECT * INTO r.fc_period_used, r.fc_day_used, r.fu_period_used, r.fu_day_used
                  FROM capgate_feature_used(r.company_id, r.user_id, p_feature, r.period_start, r.day_start);
            END IF;
            r.decision := 'company_cap';
            RETURN;
        END IF;
        t.c_short := r.cc_limit IS NOT NULL AND r.cc_used + r.cc_held + t.hold > r.cc_limit;
        t.c_hold := CASE WHEN t.c_short THEN greatest(r.cc_limit - r.cc_used - r.cc_held, 0) ELSE t.hold END;
        UPDATE company_usage SET used = used + p_units, cost_held = cost_held + t.c_hold
         WHERE company_id = r.company_id AND period_id = r.period_id
        RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
    END IF;

    UPDATE user_usage SET used = used + p_units, cost_held = cost_held + t.hold
     WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id
       AND (r.user_cap IS NULL OR used + p_units <= r.user_cap)
       AND (r.uc_limit IS NULL OR cost_used + cost_held + t.hold <= r.uc_limit)
    RETURNING used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held;
    IF NOT FOUND THEN
        INSERT INTO user_usage (company_id, period_id, user_id, used) VALUES (r.company_id, r.period_id, r.user_id, 0)
            ON CONFLICT DO NOTHING;
        SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
         WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id FOR UPDATE;
        IF r.user_cap IS NOT NULL AND r.user_used + p_units > r.user_cap THEN
            UPDATE company_usage
               SET used = used - p_units, cost_held = cost_held - t.c_hold
             WHERE company_id = r.company_id AND period_id = r.period_id
            RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
            IF p_feature IS NOT NULL THEN
                SELECT * INTO r.fc_period_used, r.fc_day_used, r.fu_period_used, r.fu_day_used
                  FROM capgate_feature_used(r.company_id, r.user_id, p_feature, r.period_start, r.day_start);
            END IF;
            r.decision := 'user_cap';
            RETURN;
        END IF;
        t.u_short := r.uc_limit IS NOT NULL AND r.uc_used + r.uc_held + t.hold > r.uc_limit;
        UPDATE user_usage SET used = used + p_units, cost_held = cost_held + CASE WHEN t.u_short THEN 0 ELSE t.hold END
         WHERE company_id = r.company_id AND period_id = r.period_id AND user_id = r.user_id
        RETURNING used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held;
    END IF;
END;
$$;
