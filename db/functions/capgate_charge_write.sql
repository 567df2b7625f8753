-- Step 5 of capgate_charge and its write, for a call every counter took (r, t: what the steps
-- before decided): a charge that brings a bounded counter to a notification threshold
-- (p_thresholds, percent; p_low the lowest) writes its notification row (capgate_notify); the
-- ledger row (with the top-up grants that paid its parts and its rate windows); a call holding a
-- concurrency slot in rate_calls, leased p_lease seconds. Answers r charged.
CREATE FUNCTION capgate_charge_write(
    r capgate_admitted, t capgate_charge_step, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_at timestamptz, p_thresholds integer[], p_low integer, p_lease integer
) RETURNS capgate_admitted
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- Threshold notifications (SPEC §9), only for a counter at or past the lowest threshold.
    IF p_low IS NOT NULL THEN
        IF r.company_cap IS NOT NULL AND r.company_used * 100 >= p_low::bigint * r.company_cap THEN
            PERFORM capgate_notify(r.company_id, NULL, NULL, 'period', r.period_start, r.period_end, r.company_used, p_units,
                                   r.company_cap, p_thresholds);
        END IF;
        IF r.user_cap IS NOT NULL AND r.user_used * 100 >= p_low::bigint * r.user_cap THEN
            PERFORM capgate_notify(r.company_id, r.user_id, NULL, 'period', r.period_start, r.period_end, r.user_used, p_units,
                                   r.user_cap, p_thresholds);
        END IF;
        IF p_feature IS NOT NULL THEN
            IF r.fc_period_limit IS NOT NULL AND r.fc_period_used * 100 >= p_low::bigint * r.fc_period_limit THEN
                PERFORM capgate_notify(r.company_id, NULL, p_feature, 'period', r.period_start, r.period_end, r.fc_period_used,
                                       p_units, r.fc_period_limit, p_thresholds);
            END IF;
            IF r.fc_day_limit IS NOT NULL AND r.fc_day_used * 100 >= p_low::bigint * r.fc_day_limit THEN
                PERFORM capgate_notify(r.company_id, NULL, p_feature, 'day', r.day_start, r.day_end, r.fc_day_used, p_units,
                                       r.fc_day_limit, p_thresholds);
            END IF;
            IF r.fu_period_limit IS NOT NULL AND r.fu_period_used * 100 >= p_low::bigint * r.fu_period_limit THEN
                PERFORM capgate_notify(r.company_id, r.user_id, p_feature, 'period', r.period_start, r.period_end, r.fu_period_used,
                                       p_units, r.fu_period_limit, p_thresholds);
            END IF;
            IF r.fu_day_limit IS NOT NULL AND r.fu_day_used * 100 >= p_low::bigint * r.fu_day_limit THEN
                PERFORM capgate_notify(r.company_id, r.user_id, p_feature, 'day', r.day_start, r.day_end, r.fu_day_used, p_units,
                                       r.fu_day_limit, p_thresholds);
            END IF;
        END IF;
    END IF;

    INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature, feature_day,
                              request_id, outcome, created_at, hold_micros, units_grant_id, cost_grant_id, rate_minute, rate_tokens,
                              rate_scopes, units_grant_part, cost_grant_part)
    VALUES (r.company_id, r.period_id, r.user_id, p_units, p_method, p_route, p_model, p_feature, r.day_start,
            p_request_id, 'charged', p_at, r.hold, t.units_grant, t.cost_grant, r.rate_minute, r.rate_tokens,
            CASE WHEN t.rated THEN t.scopes | CASE WHEN r.u_slots IS NOT NULL OR r.fu_slots IS NOT NULL THEN 4 ELSE 0 END END,
            CASE WHEN t.units_grant IS NOT NULL THEN t.g_part END, CASE WHEN t.cost_grant IS NOT NULL THEN t.hold - t.c_hold END)
    RETURNING id INTO r.ledger_id;
    -- A call holding a slot is in rate_calls until its end (capgate_rate_end) or its lease; its
    -- token hold is settled from the ledger row by its settlement.
    IF r.u_slots IS NOT NULL OR r.fu_slots IS NOT NULL THEN
        INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
        VALUES (r.company_id, r.ledger_id, r.user_id, coalesce(p_feature, ''), r.rate_minute, r.rate_tokens,
                t.scopes | 4,
                p_at + make_interval(secs => p_lease));
    END IF;
    r.decision := 'charged';
    RETURN r;
END;
$$;
