-- Many calls without an Idempotency-Key in one transaction (the gateway's group commit), one
-- array element per call, decided in arrival order exactly as capgate_charge decides one call.
-- Arrays cannot carry NULL elements from the gateway's driver, so "absent" is the empty value:
-- '' (key hash, model, feature), the nil UUID (company, user) or -1 (routes version).
--
-- The steps, each a function of its own (one capgate_batch_call per call passes between them,
-- the counters as capgate_batch_counter arrays in key order, the decisions as
-- capgate_batch_outcome):
-- 1. capgate_batch_read: who makes each call (the key, or the token's company and user), its
--    period (locked FOR KEY SHARE as it is read, before any counter), caps, feature, entitlement,
--    its hold (capgate_hold of its bound p_prompt, p_max_tokens, p_cache, p_window; -2, -1, 0, 0
--    when it has none), its rate limits and token bound, and the counter slots it needs. Calls
--    whose company has no period containing their time have their companies moved into it
--    (capgate_roll_company, in company order) and are read again.
-- 2. capgate_batch_lock: lock (or create) the counters, each kind in key order: company, user,
--    company feature period, company feature day, user feature period, user feature day (the unit
--    and cost counters, with the plan's rate windows in the company and user rows); 2b.
--    capgate_batch_lock_windows: the rows of the entitlements' rate windows, in key order.
-- 3. capgate_batch_decide: decide in arrival order against the locked values (capgate_batch_refusal,
--    then the caps, feature limits and budgets, top-up grants locked last by capgate_grant_take,
--    then capgate_batch_rate's windows; a charge that brings a bounded counter to a notification
--    threshold writes its notification row: capgate_notify).
-- 4. capgate_batch_write: write what moved and the ledger; 5. capgate_batch_answer: one row a call.
-- Every admission takes its locks in this order (period, counters by kind in key order, rate
-- windows, grants), so concurrent batches and single calls never deadlock.
-- p_ended: the ledger ids of calls that ended on this gateway whose slot rows may not be deleted
-- yet (capgate_rate_end writes them apart, off this transaction's path): they are not counted as
-- live, so a call this gateway admits after an answer ended finds its slot free.
CREATE FUNCTION capgate_admit_batch(
    p_key_hash bytea[], p_company uuid[], p_user uuid[], p_units integer[], p_method text[], p_route text[],
    p_model text[], p_feature text[], p_request_id text[], p_routes_version bigint[], p_at timestamptz[],
    p_relaxed boolean, p_prompt bigint[], p_max_tokens bigint[], p_cache smallint[], p_window bigint[],
    p_ended bigint[] DEFAULT '{}'
) RETURNS SETOF capgate_admitted
LANGUAGE plpgsql
-- Planned once per session: re-planning for every call (custom plans for the array arguments)
-- cost more than running them (measured: 2.8 ms -> 1.1 ms a call).
SET plan_cache_mode = force_generic_plan
-- Never a sequential scan: every statement here reads or writes rows by key. A plan is made once
-- per connection, from the statistics of that moment; on a fresh database the counter and window
-- tables are empty (or analyzed empty), and the planner then scans them sequentially even for a
-- primary-key equality, a plan the connection kept while the table grew (measured, session 22:
-- the rate window update of step 4 read every row of rate_windows, 1.5 ms a batch at 11,000
-- rows, against 0.16 ms for the user counters the benchmark seeds first). Never JIT: a statement
-- that still needs a scan (the tiny plans table of the upgrade offer) then costs over 10^10, past
-- jit_above_cost, and a generic plan was compiled again at every execution (330 ms a batch).
-- Every function of the admission, settlement and refund paths sets the same, each step of this
-- one too (a step is planned in its own function, whoever calls it).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_routes bigint;
    v_thresholds integer[];
    v_low integer;
    v_lease integer;
    -- The batch's models, each priced once: the price at the model's latest call, and whether it
    -- is the price of every call of that model (a row in force since its earliest call is every
    -- call's price: an earlier call sees a subset of the rows, which still holds that one, the
    -- most specific; a model without a price at its latest call has none at an earlier one;
    -- otherwise its calls are looked up one by one).
    v_models text[];
    v_prices prices[];
    v_exact boolean[];
    v_company uuid;
    v_at timestamptz;
    v_calls capgate_batch_call[];
    v_outcomes capgate_batch_outcome[];
    v_c capgate_batch_counter[]; v_u capgate_batch_counter[]; v_fp capgate_batch_counter[];
    v_fd capgate_batch_counter[]; v_up capgate_batch_counter[]; v_ud capgate_batch_counter[];
    v_w capgate_batch_counter[]; v_wfc integer[]; v_wfu integer[];
BEGIN
    IF coalesce(cardinality(p_units), 0) = 0 THEN
        RETURN;
    END IF;
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT routes, thresholds, (SELECT min(t) FROM unnest(thresholds) t), slot_lease_seconds
      INTO v_routes, v_thresholds, v_low, v_lease
      FROM config_versions WHERE singleton;
    -- A slot keeps the lease of the gateway that takes it (SPEC §14): its sessions carry its
    -- rate.leaseSeconds; config_versions' is the default for any other session.
    v_lease := coalesce(nullif(current_setting('capgate.slot_lease_seconds', true), '')::integer, v_lease);
    IF EXISTS (SELECT 1 FROM prices) THEN  -- an empty book: no call is looked up
        SELECT array_agg(d.model), array_agg(pr.q), array_agg(pr.q IS NULL OR (pr.q).effective_from <= d.lo)
          INTO v_models, v_prices, v_exact
          FROM (SELECT u.m AS model, min(u.at) AS lo, max(u.at) AS hi
                  FROM unnest(p_model, p_at, p_units) AS u(m, at, units) WHERE u.m <> '' AND u.units > 0 GROUP BY u.m) d
          LEFT JOIN LATERAL (SELECT q FROM capgate_price(d.model, d.hi) q) pr ON true;
    END IF;

    -- 1. The calls; companies whose period ended (or never started) renewed as the rollover
    --    would, once, and their calls read again.
    v_calls := capgate_batch_read(p_key_hash, p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                                  p_request_id, p_routes_version, p_at, p_prompt, p_max_tokens, p_cache, p_window,
                                  v_routes, v_models, v_prices, v_exact);
    FOR v_company, v_at IN
        SELECT s.company, max(s.at) FROM unnest(v_calls) s
         WHERE s.period IS NULL
           AND s.company IN (SELECT g.company FROM unnest(v_calls) g
                              WHERE g.auth = 'ok' AND g.period IS NULL AND g.company IS NOT NULL AND NOT g.stale)
         GROUP BY s.company ORDER BY s.company
    LOOP
        PERFORM capgate_roll_company(v_company, v_at);
    END LOOP;
    IF FOUND THEN
        v_calls := capgate_batch_read(p_key_hash, p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                                      p_request_id, p_routes_version, p_at, p_prompt, p_max_tokens, p_cache, p_window,
                                      v_routes, v_models, v_prices, v_exact);
    END IF;

    -- 2. Lock the counters; 2b. the feature rate windows, when a call's entitlement has one.
    SELECT * INTO v_c, v_u, v_fp, v_fd, v_up, v_ud FROM capgate_batch_lock(v_calls, p_ended);
    IF EXISTS (SELECT 1 FROM unnest(v_calls) s
                WHERE coalesce(s.fcrpm, s.fctpm, s.furpm, s.futpm, s.fconc) IS NOT NULL) THEN
        SELECT * INTO v_w, v_wfc, v_wfu FROM capgate_batch_lock_windows(v_calls, p_ended);
    END IF;

    -- 3. Decide in arrival order; 4. write; 5. answer.
    SELECT * INTO v_c, v_u, v_fp, v_fd, v_up, v_ud, v_w, v_outcomes
      FROM capgate_batch_decide(v_calls, v_wfc, v_wfu, v_thresholds, v_low, v_c, v_u, v_fp, v_fd, v_up, v_ud, v_w);
    PERFORM capgate_batch_write(v_calls, v_outcomes, v_lease, v_c, v_u, v_fp, v_fd, v_up, v_ud, v_w);
    RETURN QUERY SELECT * FROM capgate_batch_answer(v_calls, v_outcomes);
END;
$$;
