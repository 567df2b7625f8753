-- Admits p_units for one user of one company at p_at, or changes nothing: the single-call
-- admission every other path builds on (capgate_admit, capgate_admit_idempotent).
--
-- 1. p_routes_version (NULL: not checked) older than config_versions.routes: stale_routes.
-- 2. The period containing p_at, locked FOR KEY SHARE before any counter; none: the company is
--    moved into it first as `capgate rollover` would (capgate_roll_company locks the company row,
--    so concurrent calls at the boundary open one period).
-- 3. p_feature (NULL: none): unknown or inactive: unknown_feature; not one of p_bound (the
--    features a bound credential may be charged to; NULL: unbound): feature_not_bound; no
--    entitlement in the plan or not enabled: feature_not_in_plan. p_units = 0 (a free route): a ledger row and nothing else.
-- 4. Lock order: company counter, user counter, then the feature's counters (company period,
--    company day, user period, user day). Each is a conditional update that takes its row lock;
--    a refusal gives back what this call already added (its rows stay locked until commit).
-- 5. A charge that brings a bounded counter to a notification threshold (config_versions.
--    thresholds, percent) writes its notification row here too (capgate_notify).
-- 6. Cost (SPEC §11): a metered call (p_units > 0) is held its worst case (capgate_hold of the
--    price of p_model at p_at and the bound p_prompt, p_max_tokens, p_cache, p_window, whose
--    meaning capgate_hold gives; the defaults are "cannot be bounded"). Where a budget applies
--    (the plan's company budget, or the user's), a call that cannot be held is refused before any
--    counter (unpriced_model, unbounded_call, max_tokens_required). The hold goes into the same
--    company and user counter updates as the units (cost_held), conditional on used + held + hold
--    within the budget; after the caps and the feature counters, a budget it does not fit refuses
--    the call (budget_exceeded, company before user) and everything this call added is given back.
-- 7. Top-ups (SPEC §12): what the company cap or budget cannot hold, a grant may pay
--    (capgate_grant_take), and only that: the call is split. The company cap pays what is left
--    under it (v_g_part: the rest, the grant's units); the company budget holds its room
--    (v_c_hold; the rest of the hold is the grant's). The cap's refusal waits for no grant being
--    found for the rest (step 1, read); the grant is locked after the user and feature counters
--    (3a) and taken last (3c), once nothing else can refuse the call: its part of the units then
--    leaves the company counter (which took all of them like any call's, so a refusal in between
--    gives them back as it gives back everything), its part of the hold never entered it, and the
--    ledger row names the grants and their parts (units_grant_id, units_grant_part, cost_grant_id,
--    cost_grant_part). One grant per part: a part no single grant can hold is refused, not split.
-- 8. Rate windows (SPEC §14), for a metered call whose plan or entitlement sets any: a token
--    window needs the call bounded (capgate_rate_tokens; else unbounded_call or
--    max_tokens_required, before any counter); after the budgets (3b), before the grants are
--    taken (3c), capgate_rate_take counts the call in its minute windows (the plan's in the
--    company's and the user's counter rows, locked in 1 and 2) and takes a concurrency slot
--    (rate_calls, leased for config_versions.slot_lease_seconds), or refuses it
--    (rate_limited) and everything this call added is given back.
CREATE FUNCTION capgate_charge(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_routes_version bigint, p_at timestamptz, p_bound text[] DEFAULT NULL,
    p_prompt bigint DEFAULT -2, p_max_tokens bigint DEFAULT -1, p_cache smallint DEFAULT 0, p_window bigint DEFAULT 0,
    p_ended bigint[] DEFAULT '{}'
) RETURNS capgate_admitted
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r capgate_admitted;
    v_user_found boolean;
    v_zone text;
    v_active boolean;
    e plan_features%ROWTYPE;
    v_step integer := 0;   -- feature counters charged so far (1..4)
    v_routes bigint;
    v_thresholds integer[];
    v_low integer;         -- the lowest notification threshold, percent
    v_price prices%ROWTYPE;
    v_hold bigint := 0;    -- the hold as the counters take it (0: nothing held)
    v_c_short boolean := false;  -- the company budget cannot take the hold (decided after the caps and features)
    v_u_short boolean := false;
    v_lease integer;       -- the session's capgate.slot_lease_seconds, else config_versions'
    v_rated boolean;       -- a rate window or a concurrency limit applies (8)
    v_rate capgate_rate;
    v_g_units boolean := false;  -- the company cap cannot hold the call, a top-up grant can (7)
    v_g_part bigint;       -- the units past what the company cap has left: the grant's part (7)
    v_c_hold bigint;       -- the part of the hold the company budget takes (7; v_hold unless v_c_short)
    v_units_grant bigint;
    v_cost_grant bigint;
    v_taken boolean;
BEGIN
    r.item := 1;
    r.auth := 'ok';
    r.company_id := p_company;
    r.user_id := p_user;
    SELECT routes, thresholds, (SELECT min(t) FROM unnest(thresholds) t), slot_lease_seconds
      INTO v_routes, v_thresholds, v_low, v_lease
      FROM config_versions WHERE singleton;
    -- A slot keeps the lease of the gateway that takes it (SPEC §14): its sessions carry its
    -- rate.leaseSeconds; config_versions' is the default for any other session.
    v_lease := coalesce(nullif(current_setting('capgate.slot_lease_seconds', true), '')::integer, v_lease);
    IF p_routes_version IS NOT NULL AND p_routes_version <> v_routes THEN
        r.decision := 'stale_routes';
        RETURN r;
    END IF;

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
          LEFT JOIN users u ON u.company_id = pp.company_id AND u.id = p_user AND NOT u.disabled
         WHERE pp.company_id = p_company AND pp.started_at <= p_at AND pp.ends_at > p_at
           FOR KEY SHARE OF pp;
        EXIT WHEN FOUND OR pass = 2;
        PERFORM capgate_roll_company(p_company, p_at);
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

    IF p_units = 0 OR r.decision = 'feature_not_in_plan' THEN
        -- A free route: in the ledger, counted against nothing, held nothing. A feature not in
        -- the plan: refused, its 402's usage showing the counters as they stand (SPEC §3).
        SELECT used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held
          FROM company_usage WHERE company_id = p_company AND period_id = r.period_id;
        SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
         WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user;
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
        VALUES (p_company, r.period_id, p_user, 0, p_method, p_route, p_model, p_feature, p_request_id, 'charged', p_at)
        RETURNING id INTO r.ledger_id;
        r.decision := 'charged';
        RETURN r;
    END IF;

    -- 0. The hold, and whether the call can be held where a budget applies. (An empty price book,
    --    a caps-only gateway, costs one probe of its index, not the lookup of every prefix.)
    IF p_model IS NOT NULL AND EXISTS (SELECT 1 FROM prices) THEN
        v_price := capgate_price_row(p_model, p_at);
    END IF;
    r.hold := capgate_hold(v_price, p_prompt, p_max_tokens, p_cache, p_window);
    v_hold := coalesce(r.hold, 0);
    v_c_hold := v_hold;
    IF r.cc_limit IS NOT NULL OR r.uc_limit IS NOT NULL THEN
        r.decision := CASE WHEN p_prompt < -1 THEN 'unbounded_call'
                           WHEN v_price.model IS NULL THEN 'unpriced_model'
                           WHEN p_max_tokens < 0 THEN 'max_tokens_required' END;
        IF r.decision IS NOT NULL THEN
            RETURN r;
        END IF;
    END IF;
    v_rated := r.company_rpm IS NOT NULL OR r.company_tpm IS NOT NULL OR r.user_rpm IS NOT NULL
               OR r.user_tpm IS NOT NULL OR r.user_concurrency IS NOT NULL OR r.f_company_rpm IS NOT NULL
               OR r.f_company_tpm IS NOT NULL OR r.f_user_rpm IS NOT NULL OR r.f_user_tpm IS NOT NULL
               OR r.f_user_concurrency IS NOT NULL;
    IF v_rated THEN
        r.rate_tokens := capgate_rate_tokens(v_price, p_prompt, p_max_tokens, p_window);
        IF (r.rate_tokens IS NULL OR v_price.model IS NULL)
           AND (r.company_tpm IS NOT NULL OR r.user_tpm IS NOT NULL OR r.f_company_tpm IS NOT NULL OR r.f_user_tpm IS NOT NULL) THEN
            -- A token window, as a budget, bounds only a priced call (SPEC §11: fail closed).
            r.decision := CASE WHEN p_prompt < -1 THEN 'unbounded_call' WHEN v_price.model IS NULL THEN 'unpriced_model'
                               WHEN p_max_tokens < 0 THEN 'max_tokens_required' ELSE 'unbounded_call' END;
            RETURN r;
        END IF;
        r.rate_tokens := coalesce(r.rate_tokens, 0);
    END IF;

    -- 1. company counter (created at zero by the period's first call)
    UPDATE company_usage SET used = used + p_units, cost_held = cost_held + v_hold
     WHERE company_id = p_company AND period_id = r.period_id
       AND (r.company_cap IS NULL OR used + p_units <= r.company_cap)
       AND (r.cc_limit IS NULL OR cost_used + cost_held + v_hold <= r.cc_limit)
    RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
    IF NOT FOUND THEN
        INSERT INTO company_usage (company_id, period_id, used) VALUES (p_company, r.period_id, 0) ON CONFLICT DO NOTHING;
        SELECT used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held FROM company_usage
         WHERE company_id = p_company AND period_id = r.period_id FOR UPDATE;
        v_g_part := CASE WHEN r.company_cap IS NOT NULL AND r.company_used + p_units > r.company_cap
                         THEN p_units - greatest(r.company_cap - r.company_used, 0) END;
        v_g_units := v_g_part IS NOT NULL
                     AND (capgate_grant_take(p_company, p_at, v_g_part, NULL, 'peek')).units_grant IS NOT NULL;
        IF r.company_cap IS NOT NULL AND r.company_used + p_units > r.company_cap AND NOT v_g_units THEN
            SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
             WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user;
            r.user_used := coalesce(r.user_used, 0);
            r.uc_used := coalesce(r.uc_used, 0);
            r.uc_held := coalesce(r.uc_held, 0);
            IF p_feature IS NOT NULL THEN
                -- The feature's windows as they stand, for the refusal's RateLimit fields.
                SELECT * INTO r.fc_period_used, r.fc_day_used, r.fu_period_used, r.fu_day_used
                  FROM capgate_feature_used(p_company, p_user, p_feature, r.period_start, r.day_start);
            END IF;
            r.decision := 'company_cap';
            RETURN r;
        END IF;
        v_c_short := r.cc_limit IS NOT NULL AND r.cc_used + r.cc_held + v_hold > r.cc_limit;
        v_c_hold := CASE WHEN v_c_short THEN greatest(r.cc_limit - r.cc_used - r.cc_held, 0) ELSE v_hold END;
        UPDATE company_usage SET used = used + p_units, cost_held = cost_held + v_c_hold
         WHERE company_id = p_company AND period_id = r.period_id
        RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
    END IF;

    -- 2. user counter
    UPDATE user_usage SET used = used + p_units, cost_held = cost_held + v_hold
     WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user
       AND (r.user_cap IS NULL OR used + p_units <= r.user_cap)
       AND (r.uc_limit IS NULL OR cost_used + cost_held + v_hold <= r.uc_limit)
    RETURNING used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held;
    IF NOT FOUND THEN
        INSERT INTO user_usage (company_id, period_id, user_id, used) VALUES (p_company, r.period_id, p_user, 0)
            ON CONFLICT DO NOTHING;
        SELECT used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held FROM user_usage
         WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user FOR UPDATE;
        IF r.user_cap IS NOT NULL AND r.user_used + p_units > r.user_cap THEN
            UPDATE company_usage
               SET used = used - p_units, cost_held = cost_held - v_c_hold
             WHERE company_id = p_company AND period_id = r.period_id
            RETURNING used, cost_used, cost_held INTO r.company_used, r.cc_used, r.cc_held;
            IF p_feature IS NOT NULL THEN
                SELECT * INTO r.fc_period_used, r.fc_day_used, r.fu_period_used, r.fu_day_used
                  FROM capgate_feature_used(p_company, p_user, p_feature, r.period_start, r.day_start);
            END IF;
            r.decision := 'user_cap';
            RETURN r;
        END IF;
        v_u_short := r.uc_limit IS NOT NULL AND r.uc_used + r.uc_held + v_hold > r.uc_limit;
        UPDATE user_usage SET used = used + p_units, cost_held = cost_held + CASE WHEN v_u_short THEN 0 ELSE v_hold END
         WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user
        RETURNING used, cost_used, cost_held INTO r.user_used, r.uc_used, r.uc_held;
    END IF;

    -- 3. the feature's counters, each created on its window's first call
    IF p_feature IS NOT NULL THEN
        INSERT INTO company_feature_usage AS f (company_id, feature_id, span, starts_at, ends_at, used)
        SELECT p_company, p_feature, 'period', r.period_start, r.period_end, p_units
         WHERE e.period_limit IS NULL OR p_units <= e.period_limit
        ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
         WHERE e.period_limit IS NULL OR f.used + p_units <= e.period_limit
        RETURNING f.used INTO r.fc_period_used;
        IF FOUND THEN
            v_step := 1;
            INSERT INTO company_feature_usage AS f (company_id, feature_id, span, starts_at, ends_at, used)
            SELECT p_company, p_feature, 'day', r.day_start, r.day_end, p_units
             WHERE e.daily_limit IS NULL OR p_units <= e.daily_limit
            ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
             WHERE e.daily_limit IS NULL OR f.used + p_units <= e.daily_limit
            RETURNING f.used INTO r.fc_day_used;
        END IF;
        IF FOUND AND v_step = 1 THEN
            v_step := 2;
            INSERT INTO user_feature_usage AS f (company_id, user_id, feature_id, span, starts_at, ends_at, used)
            SELECT p_company, p_user, p_feature, 'period', r.period_start, r.period_end, p_units
             WHERE e.user_period_limit IS NULL OR p_units <= e.user_period_limit
            ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
             WHERE e.user_period_limit IS NULL OR f.used + p_units <= e.user_period_limit
            RETURNING f.used INTO r.fu_period_used;
        END IF;
        IF FOUND AND v_step = 2 THEN
            v_step := 3;
            INSERT INTO user_feature_usage AS f (company_id, user_id, feature_id, span, starts_at, ends_at, used)
            SELECT p_company, p_user, p_feature, 'day', r.day_start, r.day_end, p_units
             WHERE e.user_daily_limit IS NULL OR p_units <= e.user_daily_limit
            ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = f.used + p_units
             WHERE e.user_daily_limit IS NULL OR f.used + p_units <= e.user_daily_limit
            RETURNING f.used INTO r.fu_day_used;
            IF FOUND THEN
                v_step := 4;
            END IF;
        END IF;
        IF v_step < 4 THEN
            r.feature_refused := (ARRAY['company.period', 'company.day', 'user.period', 'user.day'])[v_step + 1];
            r := capgate_give_back(r, p_units, v_step, v_c_hold, CASE WHEN v_u_short THEN 0 ELSE v_hold END);
            r.decision := 'feature_limit_exceeded';
            RETURN r;
        END IF;
    END IF;

    -- 3a. top-ups (7): the grants that pay what the company could not hold, locked (read only when
    --     the user's budget refuses the call anyway)
    IF v_g_units OR v_c_short THEN
        SELECT * INTO v_units_grant, v_cost_grant, v_taken
          FROM capgate_grant_take(p_company, p_at, CASE WHEN v_g_units THEN v_g_part END,
                                  CASE WHEN v_c_short THEN v_hold - v_c_hold END,
                                  CASE WHEN v_u_short THEN 'peek' ELSE 'lock' END);
        IF v_g_units AND v_units_grant IS NULL THEN
            -- A concurrent call took what was left since step 1: the company cap refuses after all.
            r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                                   v_c_hold, CASE WHEN v_u_short THEN 0 ELSE v_hold END);
            r.decision := 'company_cap';
            RETURN r;
        END IF;
    END IF;

    -- 3b. the budgets: company (unless a grant holds the call), then user (SPEC §11)
    IF (v_c_short AND v_cost_grant IS NULL) OR v_u_short THEN
        r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                               v_c_hold, CASE WHEN v_u_short THEN 0 ELSE v_hold END);
        r.budget_scope := CASE WHEN v_c_short AND v_cost_grant IS NULL THEN 'company' ELSE 'user' END;
        r.decision := 'budget_exceeded';
        RETURN r;
    END IF;

    -- 3b'. the rate windows (8): a refusal gives back what the counters took (the part of a hold
    --      a grant holds never entered the company counter: v_c_hold)
    IF v_rated THEN
        v_rate := capgate_rate_take(p_company, r.period_id, r.period_start, p_user, p_at, r.rate_tokens, r.company_rpm, r.company_tpm, r.user_rpm,
                                    r.user_tpm, r.user_concurrency, p_feature, r.f_company_rpm, r.f_company_tpm,
                                    r.f_user_rpm, r.f_user_tpm, r.f_user_concurrency, p_ended);
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
        IF v_rate.refused IS NOT NULL THEN
            r := capgate_give_back(r, p_units, CASE WHEN p_feature IS NULL THEN 0 ELSE 4 END,
                                   v_c_hold, CASE WHEN v_u_short THEN 0 ELSE v_hold END);
            r.rate_refused := v_rate.refused;
            r.decision := 'rate_limited';
            RETURN r;
        END IF;
    END IF;

    -- 3c. top-ups (7): the grants locked in 3a are taken, the last step that changes a counter
    IF v_units_grant IS NOT NULL OR v_cost_grant IS NOT NULL THEN
        SELECT * INTO v_units_grant, v_cost_grant, v_taken
          FROM capgate_grant_take(p_company, p_at, CASE WHEN v_g_units THEN v_g_part END,
                                  CASE WHEN v_c_short THEN v_hold - v_c_hold END,
                                  'take');
        IF NOT v_taken THEN
            RAISE EXCEPTION 'capgate_charge: a top-up grant locked for this call was not found again';
        END IF;
        IF v_g_units THEN
            UPDATE company_usage SET used = used - v_g_part WHERE company_id = p_company AND period_id = r.period_id
            RETURNING used INTO r.company_used;
        END IF;
    END IF;

    -- 4. Threshold notifications (SPEC §9), only for a counter at or past the lowest threshold.
    IF v_low IS NOT NULL THEN
        IF r.company_cap IS NOT NULL AND r.company_used * 100 >= v_low::bigint * r.company_cap THEN
            PERFORM capgate_notify(p_company, NULL, NULL, 'period', r.period_start, r.period_end, r.company_used, p_units,
                                   r.company_cap, v_thresholds);
        END IF;
        IF r.user_cap IS NOT NULL AND r.user_used * 100 >= v_low::bigint * r.user_cap THEN
            PERFORM capgate_notify(p_company, p_user, NULL, 'period', r.period_start, r.period_end, r.user_used, p_units,
                                   r.user_cap, v_thresholds);
        END IF;
        IF p_feature IS NOT NULL THEN
            IF e.period_limit IS NOT NULL AND r.fc_period_used * 100 >= v_low::bigint * e.period_limit THEN
                PERFORM capgate_notify(p_company, NULL, p_feature, 'period', r.period_start, r.period_end, r.fc_period_used,
                                       p_units, e.period_limit, v_thresholds);
            END IF;
            IF e.daily_limit IS NOT NULL AND r.fc_day_used * 100 >= v_low::bigint * e.daily_limit THEN
                PERFORM capgate_notify(p_company, NULL, p_feature, 'day', r.day_start, r.day_end, r.fc_day_used, p_units,
                                       e.daily_limit, v_thresholds);
            END IF;
            IF e.user_period_limit IS NOT NULL AND r.fu_period_used * 100 >= v_low::bigint * e.user_period_limit THEN
                PERFORM capgate_notify(p_company, p_user, p_feature, 'period', r.period_start, r.period_end, r.fu_period_used,
                                       p_units, e.user_period_limit, v_thresholds);
            END IF;
            IF e.user_daily_limit IS NOT NULL AND r.fu_day_used * 100 >= v_low::bigint * e.user_daily_limit THEN
                PERFORM capgate_notify(p_company, p_user, p_feature, 'day', r.day_start, r.day_end, r.fu_day_used, p_units,
                                       e.user_daily_limit, v_thresholds);
            END IF;
        END IF;
    END IF;

    INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature, feature_day,
                              request_id, outcome, created_at, hold_micros, units_grant_id, cost_grant_id, rate_minute, rate_tokens,
                              rate_scopes, units_grant_part, cost_grant_part)
    VALUES (p_company, r.period_id, p_user, p_units, p_method, p_route, p_model, p_feature, r.day_start,
            p_request_id, 'charged', p_at, r.hold, v_units_grant, v_cost_grant, r.rate_minute, r.rate_tokens,
            CASE WHEN v_rated THEN v_rate.scopes | CASE WHEN v_rate.u_slots IS NOT NULL OR v_rate.fu_slots IS NOT NULL
                                                        THEN 4 ELSE 0 END END,
            CASE WHEN v_units_grant IS NOT NULL THEN v_g_part END, CASE WHEN v_cost_grant IS NOT NULL THEN v_hold - v_c_hold END)
    RETURNING id INTO r.ledger_id;
    -- A call holding a slot is in rate_calls until its end (capgate_rate_end) or its lease; its
    -- token hold is settled from the ledger row by its settlement.
    IF v_rate.u_slots IS NOT NULL OR v_rate.fu_slots IS NOT NULL THEN
        INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
        VALUES (p_company, r.ledger_id, p_user, coalesce(p_feature, ''), r.rate_minute, r.rate_tokens,
                v_rate.scopes | CASE WHEN v_rate.u_slots IS NOT NULL OR v_rate.fu_slots IS NOT NULL THEN 4 ELSE 0 END,
                p_at + make_interval(secs => v_lease));
    END IF;
    r.decision := 'charged';
    RETURN r;
END;
$$;
