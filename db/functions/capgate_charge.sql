-- Admits p_units for one user of one company at p_at, or changes nothing: the single-call
-- admission every other path builds on (capgate_admit, capgate_admit_idempotent). Its steps are
-- functions of their own, each passing on the call's row (capgate_admitted, r) and what the next
-- needs (capgate_charge_step, t): capgate_charge_read (2, 3), capgate_charge_free (a call no counter
-- takes), capgate_charge_counters (the hold and the token bound of 6 and 8, then 4: company,
-- user), capgate_charge_features (4: the feature's), capgate_charge_grants (7, 6's budgets, 8; not
-- called for a call none of them concerns) and capgate_charge_write (5, the ledger).
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
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql). Its steps
-- also plan once per session, as every function of the batched path.
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r capgate_admitted;
    st capgate_charge_step;
    x record;
    v_routes bigint;
    v_thresholds integer[];
    v_low integer;         -- the lowest notification threshold, percent
    v_lease integer;       -- the session's capgate.slot_lease_seconds, else config_versions'
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
    r := capgate_charge_read(r, p_at, p_feature, p_bound);
    IF r.decision <> 'feature_not_in_plan' THEN
        RETURN r;
    ELSIF p_units = 0 OR r.decision = 'feature_not_in_plan' THEN
        RETURN capgate_charge_free(r, p_method, p_route, p_model, p_feature, p_request_id, p_at);
    END IF;
    x := capgate_charge_counters(r, p_units, p_at, p_feature, p_model, p_prompt, p_max_tokens, p_cache, p_window);
    r := x.r;
    st := x.t;
    IF r.decision IS NULL AND p_feature IS NOT NULL THEN
        r := capgate_charge_features(r, st, p_units, p_feature);
    END IF;
    -- Nothing for the grants step to do for a call no grant, budget or rate window concerns.
    IF r.decision IS NULL AND (st.g_units OR st.c_short OR st.u_short OR st.rated) THEN
        x := capgate_charge_grants(r, st, p_units, p_at, p_feature, p_ended);
        r := x.r;
        st := x.t;
    END IF;
    IF r.decision IS NOT NULL THEN
        RETURN r;
    END IF;
    RETURN capgate_charge_write(r, st, p_units, p_method, p_route, p_model, p_feature, p_request_id, p_at, v_thresholds,
                                v_low, v_lease);
END;
$$;
