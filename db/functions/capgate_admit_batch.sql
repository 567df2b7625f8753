-- Many calls without an Idempotency-Key in one transaction (the gateway's group commit), one
-- array element per call, decided in arrival order exactly as capgate_charge decides one call.
-- Arrays cannot carry NULL elements from the gateway's driver, so "absent" is the empty value:
-- '' (key hash, model, feature), the nil UUID (company, user) or -1 (routes version).
--
-- 1. Who makes each call (the key, or the token's company and user), its period (locked FOR KEY
--    SHARE as it is read, before any counter), caps, feature, entitlement and whether the key may
--    be charged to that feature (feature_not_bound, as capgate_charge decides), and the counter
--    slots it needs. Calls whose company has no period containing their time have their
--    companies moved into it (capgate_roll_company, in company order) and are read again.
-- 2. Lock (or create) the counters, each kind in key order: company, user, company feature
--    period, company feature day, user feature period, user feature day.
-- 3. Decide in arrival order against the locked values (a charge that brings a bounded counter
--    to a notification threshold writes its notification row: capgate_notify); 4. write what
--    moved and the ledger.
-- Cost (SPEC §11) as capgate_charge: each call's hold (capgate_hold of its bound p_prompt,
-- p_max_tokens, p_cache, p_window; -2, -1, 0, 0 when it has none) is read with the call in step 1,
-- the cost counters are locked with the unit counters, and a call that cannot be held where a
-- budget applies is refused before the counters, one whose hold does not fit after them.
-- Top-ups (SPEC §12) as capgate_charge: a grant that can pay what the company cap or budget cannot
-- hold is locked when the call is decided (capgate_grant_take, after every counter is locked) and
-- taken if the call is charged. The call is split: the company counter takes what is left under
-- its cap and its budget's room, the grant only the rest (g_up units, g_cp of the hold), which
-- stays off the company counter (ledger units_grant_part, cost_grant_part).
-- Rate windows (SPEC §14) as capgate_charge: the plan's and the entitlement's limits and each
-- call's token bound (capgate_rate_tokens) are read in step 1; the plan's windows are in the
-- company and user counter rows (step 2), the entitlement's rows are locked in key order in step
-- 2b with the users' live slots; a call that passed every counter and budget is counted in its
-- windows in step 3 as capgate_rate_take would, in arrival order, or refused rate_limited.
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
-- Every function of the admission, settlement and refund paths sets the same.
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    n integer := coalesce(cardinality(p_units), 0);
    v_routes bigint;
    v_thresholds integer[];
    v_low integer;
    v_priced boolean := EXISTS (SELECT 1 FROM prices);  -- an empty book: no call is looked up
    -- The batch's models, each priced once (see step 1): the price at the model's latest call,
    -- and whether it is the price of every call of that model.
    v_models text[];
    v_prices prices[];
    v_exact boolean[];
    v_gaps uuid[];
    v_company uuid;
    v_at timestamptz;
    -- per call
    a_auth text[]; a_company uuid[]; a_user uuid[]; a_role text[]; a_user_ok boolean[]; a_stale boolean[];
    a_period bigint[]; a_plan text[]; a_plan_name text[]; a_start timestamptz[]; a_end timestamptz[];
    a_ccap bigint[]; a_ucap bigint[]; a_cslot integer[]; a_uslot integer[];
    a_feature text[]; a_fname text[]; a_factive boolean[]; a_fenabled boolean[]; a_fmsg text[]; a_bound boolean[];
    a_lp bigint[]; a_ld bigint[]; a_lup bigint[]; a_lud bigint[]; a_dstart timestamptz[]; a_dend timestamptz[];
    a_fps integer[]; a_fds integer[]; a_ups integer[]; a_uds integer[];
    a_decision text[]; a_ledger bigint[]; a_cused bigint[]; a_uused bigint[]; a_refused text[]; a_fday timestamptz[];
    a_fpu bigint[]; a_fdu bigint[]; a_upu bigint[]; a_udu bigint[];
    a_cbudget bigint[]; a_ubudget bigint[]; a_priced boolean[]; a_hold bigint[]; a_scope text[];
    a_ccu bigint[]; a_cch bigint[]; a_ucu bigint[]; a_uch bigint[];
    -- per locked counter (slot)
    c_company uuid[]; c_period bigint[]; c_used bigint[]; c_cost bigint[]; c_held bigint[];
    u_company uuid[]; u_period bigint[]; u_user uuid[]; u_used bigint[]; u_cost bigint[]; u_held bigint[];
    -- the plan's rate windows in those rows (SPEC §14): minute, calls, tokens; the user's live slots
    c_rmin timestamptz[]; c_rcalls bigint[]; c_rtok bigint[];
    u_rmin timestamptz[]; u_rcalls bigint[]; u_rtok bigint[]; u_slots bigint[];
    fp_company uuid[]; fp_feature text[]; fp_start timestamptz[]; fp_used bigint[];
    fd_company uuid[]; fd_feature text[]; fd_start timestamptz[]; fd_used bigint[];
    up_company uuid[]; up_user uuid[]; up_feature text[]; up_start timestamptz[]; up_used bigint[];
    ud_company uuid[]; ud_user uuid[]; ud_feature text[]; ud_start timestamptz[]; ud_used bigint[];
    cs integer; us integer; fps integer; fds integer; ups integer; uds integer;
    u integer;
    h bigint;
    v_lease integer;
    a_crpm integer[]; a_ctpm bigint[]; a_urpm integer[]; a_utpm bigint[]; a_uconc integer[]; a_rtok bigint[];
    a_rref text[]; a_rmin timestamptz[]; a_rscopes smallint[]; a_crc bigint[]; a_crt bigint[]; a_urc bigint[];
    a_urt bigint[]; a_us bigint[];
    a_fcrpm integer[]; a_fctpm bigint[]; a_furpm integer[]; a_futpm bigint[]; a_fconc integer[];
    a_fcrc bigint[]; a_fcrt bigint[]; a_furc bigint[]; a_furt bigint[]; a_fus bigint[];
    v_windows boolean;  -- the call has a rate window or a concurrency limit
    -- per locked feature window row (key order): its minute, counts, and the owner's live slots
    w_company uuid[]; w_owner uuid[]; w_feature text[]; w_min timestamptz[]; w_calls bigint[]; w_tokens bigint[];
    w_slots bigint[]; w_moved boolean[];
    a_wfc integer[]; a_wfu integer[];  -- per call: its feature window rows
    v_minute timestamptz; v_ref text; v_k integer; v_rpm bigint; v_tpm bigint; v_conc bigint; v_c bigint; v_t bigint;
    v_s bigint;
    v_scopes smallint; v_slot boolean;
    g_cap boolean; g_budget boolean; g_units bigint; g_cost bigint; g_taken boolean;
    g_up bigint; g_cp bigint;  -- the grant's parts of the call: units past the cap's rest, hold past the budget's room
    a_gu bigint[]; a_gc bigint[];  -- per call: the grants that paid its units, its hold
    a_gup bigint[]; a_gcp bigint[];  -- per call: the parts they paid (units, hold)
BEGIN
    IF n = 0 THEN
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

    -- 1. The calls as the database knows them. Each model is priced once, at its latest call: a
    --    row in force since its earliest call is every call's price (an earlier call sees a subset
    --    of the rows, which still holds that one, the most specific); a model without a price at
    --    its latest call has none at an earlier one; otherwise its calls are looked up one by one.
    IF v_priced THEN
        SELECT array_agg(d.model), array_agg(pr.q), array_agg(pr.q IS NULL OR (pr.q).effective_from <= d.lo)
          INTO v_models, v_prices, v_exact
          FROM (SELECT u.m AS model, min(u.at) AS lo, max(u.at) AS hi
                  FROM unnest(p_model, p_at, p_units) AS u(m, at, units) WHERE u.m <> '' AND u.units > 0 GROUP BY u.m) d
          LEFT JOIN LATERAL (SELECT q FROM capgate_price(d.model, d.hi) q) pr ON true;
    END IF;
    FOR pass IN 1..2 LOOP
        SELECT array_agg(r.auth ORDER BY r.ord), array_agg(r.company ORDER BY r.ord), array_agg(r.member ORDER BY r.ord),
               array_agg(r.role ORDER BY r.ord), array_agg(r.user_ok ORDER BY r.ord), array_agg(r.stale ORDER BY r.ord),
               array_agg(r.period ORDER BY r.ord), array_agg(r.plan ORDER BY r.ord),
               array_agg(r.plan_name ORDER BY r.ord), array_agg(r.started_at ORDER BY r.ord),
               array_agg(r.ends_at ORDER BY r.ord), array_agg(r.ccap ORDER BY r.ord), array_agg(r.ucap ORDER BY r.ord),
               array_agg(CASE WHEN r.eligible THEN r.cslot END ORDER BY r.ord),
               array_agg(CASE WHEN r.eligible THEN r.uslot END ORDER BY r.ord),
               array_agg(r.feature ORDER BY r.ord), array_agg(r.fname ORDER BY r.ord),
               array_agg(r.factive ORDER BY r.ord), array_agg(r.fenabled ORDER BY r.ord),
               array_agg(r.fmsg ORDER BY r.ord), array_agg(r.bound ORDER BY r.ord),
               array_agg(r.lp ORDER BY r.ord), array_agg(r.ld ORDER BY r.ord),
               array_agg(r.lup ORDER BY r.ord), array_agg(r.lud ORDER BY r.ord),
               array_agg(r.dstart ORDER BY r.ord), array_agg(r.dend ORDER BY r.ord),
               array_agg(CASE WHEN r.fe THEN r.fps END ORDER BY r.ord),
               array_agg(CASE WHEN r.fe THEN r.fds END ORDER BY r.ord),
               array_agg(CASE WHEN r.fe THEN r.ups END ORDER BY r.ord),
               array_agg(CASE WHEN r.fe THEN r.uds END ORDER BY r.ord),
               array_agg(r.cbudget ORDER BY r.ord), array_agg(r.ubudget ORDER BY r.ord),
               array_agg(r.priced ORDER BY r.ord), array_agg(r.hold ORDER BY r.ord),
               array_agg(r.crpm ORDER BY r.ord), array_agg(r.ctpm ORDER BY r.ord), array_agg(r.urpm ORDER BY r.ord),
               array_agg(r.utpm ORDER BY r.ord), array_agg(r.uconc ORDER BY r.ord), array_agg(r.rtok ORDER BY r.ord),
               array_agg(r.fcrpm ORDER BY r.ord), array_agg(r.fctpm ORDER BY r.ord), array_agg(r.furpm ORDER BY r.ord),
               array_agg(r.futpm ORDER BY r.ord), array_agg(r.fconc ORDER BY r.ord)
          INTO a_auth, a_company, a_user, a_role, a_user_ok, a_stale, a_period, a_plan, a_plan_name, a_start, a_end,
               a_ccap, a_ucap, a_cslot, a_uslot, a_feature, a_fname, a_factive, a_fenabled, a_fmsg, a_bound,
               a_lp, a_ld, a_lup, a_lud, a_dstart, a_dend, a_fps, a_fds, a_ups, a_uds,
               a_cbudget, a_ubudget, a_priced, a_hold, a_crpm, a_ctpm, a_urpm, a_utpm, a_uconc, a_rtok,
               a_fcrpm, a_fctpm, a_furpm, a_futpm, a_fconc
          FROM (
            SELECT y.*,
                   dense_rank() OVER (PARTITION BY y.eligible ORDER BY y.company, y.period)::integer AS cslot,
                   dense_rank() OVER (PARTITION BY y.eligible ORDER BY y.company, y.period, y.member)::integer AS uslot,
                   dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.feature, y.started_at)::integer AS fps,
                   dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.feature, y.dstart)::integer AS fds,
                   dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.member, y.feature, y.started_at)::integer
                       AS ups,
                   dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.member, y.feature, y.dstart)::integer AS uds
              FROM (
                SELECT x.*,
                       (x.eligible AND x.feature IS NOT NULL AND coalesce(x.factive, false) AND coalesce(x.fenabled, false)
                        AND x.bound AND x.units > 0) AS fe,
                       CASE WHEN x.feature IS NOT NULL AND x.period IS NOT NULL THEN capgate_day_start(x.at, x.zone) END
                           AS dstart,
                       CASE WHEN x.feature IS NOT NULL AND x.period IS NOT NULL THEN capgate_day_end(x.at, x.zone) END
                           AS dend
                  FROM (
                    SELECT i.ord, i.at, i.units, i.feature, i.stale,
                           CASE WHEN i.kh IS NULL THEN 'ok'
                                ELSE capgate_key_check(k.company_id IS NOT NULL, k.revoked_at, k.expires_at, u.disabled, i.at)
                                END AS auth,
                           coalesce(k.company_id, i.co) AS company,
                           coalesce(k.user_id, i.us) AS member,
                           u.role,
                           (u.id IS NOT NULL AND NOT u.disabled) AS user_ok,
                           p.id AS period, p.plan_id AS plan, p.name AS plan_name, p.started_at, p.ends_at, p.time_zone AS zone,
                           p.monthly_company_cap AS ccap,
                           CASE WHEN p.id IS NULL THEN NULL ELSE coalesce(u.monthly_cap, p.monthly_user_cap) END AS ucap,
                           (u.id IS NOT NULL AND NOT u.disabled AND p.id IS NOT NULL AND NOT i.stale
                             AND (i.kh IS NULL OR k.revoked_at IS NULL)) AS eligible,
                           f.name AS fname, f.is_active AS factive, e.enabled AS fenabled, e.message AS fmsg,
                           -- A key bound to features (api_keys.features) is charged only to those.
                           (i.feature IS NULL OR k.features IS NULL OR i.feature = ANY (k.features)) AS bound,
                           e.period_limit AS lp, e.daily_limit AS ld, e.user_period_limit AS lup, e.user_daily_limit AS lud,
                           p.monthly_company_budget AS cbudget,
                           CASE WHEN p.id IS NULL THEN NULL ELSE coalesce(u.monthly_budget, p.monthly_user_budget) END
                               AS ubudget,
                           (pr.q).model IS NOT NULL AS priced,
                           capgate_hold(pr.q, i.prompt, i.max_tokens, i.cache, i.window) AS hold,
                           p.company_rpm AS crpm, p.company_tpm AS ctpm, p.user_rpm AS urpm, p.user_tpm AS utpm,
                           p.user_concurrency AS uconc, capgate_rate_tokens(pr.q, i.prompt, i.max_tokens, i.window) AS rtok,
                           e.company_rpm AS fcrpm, e.company_tpm AS fctpm, e.user_rpm AS furpm, e.user_tpm AS futpm,
                           e.user_concurrency AS fconc
                      FROM unnest(p_key_hash, p_company, p_user, p_at, p_units, p_feature, p_routes_version, p_model,
                                  p_prompt, p_max_tokens, p_cache, p_window)
                           WITH ORDINALITY AS i0(kh, co, us, at, units, feature, version, model, prompt, max_tokens, cache,
                                                 window_, ord)
                     CROSS JOIN LATERAL (
                        SELECT nullif(i0.kh, ''::bytea) AS kh,
                               nullif(i0.co, '00000000-0000-0000-0000-000000000000'::uuid) AS co,
                               nullif(i0.us, '00000000-0000-0000-0000-000000000000'::uuid) AS us,
                               i0.at, i0.units, nullif(i0.feature, '') AS feature,
                               (i0.version >= 0 AND i0.version <> v_routes) AS stale, i0.ord::integer AS ord,
                               nullif(i0.model, '') AS model, i0.prompt, i0.max_tokens, i0.cache, i0.window_ AS window
                     ) i
                      LEFT JOIN api_keys k ON k.key_hash = i.kh
                      LEFT JOIN users u ON u.company_id = coalesce(k.company_id, i.co) AND u.id = coalesce(k.user_id, i.us)
                      LEFT JOIN LATERAL (
                        SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at, pl.monthly_company_cap,
                               pl.monthly_user_cap, c.time_zone, pl.monthly_company_budget, pl.monthly_user_budget,
                               pl.company_rpm, pl.company_tpm, pl.user_rpm, pl.user_tpm, pl.user_concurrency
                          FROM plan_periods pp
                          JOIN plans pl ON pl.id = pp.plan_id
                          JOIN companies c ON c.id = pp.company_id
                         WHERE pp.company_id = coalesce(k.company_id, i.co) AND pp.started_at <= i.at AND pp.ends_at > i.at
                           FOR KEY SHARE OF pp
                      ) p ON true
                      LEFT JOIN features f ON f.id = i.feature
                      LEFT JOIN plan_features e ON e.plan_id = p.plan_id AND e.feature_id = i.feature
                      LEFT JOIN LATERAL (
                        SELECT CASE WHEN x.k IS NULL THEN NULL WHEN v_exact[x.k] THEN v_prices[x.k]
                                    ELSE (SELECT q FROM capgate_price(i.model, i.at) q) END AS q
                          FROM (SELECT array_position(v_models, i.model) AS k) x
                         WHERE i.units > 0 AND v_priced
                      ) pr ON true
                  ) x
              ) y
          ) r;
        EXIT WHEN pass = 2;
        -- Companies whose period ended (or never started): renewed as the rollover would, once.
        SELECT array_agg(DISTINCT s.c ORDER BY s.c) INTO v_gaps
          FROM unnest(a_auth, a_company, a_period, a_stale) AS s(auth, c, p, stale)
         WHERE s.auth = 'ok' AND s.p IS NULL AND s.c IS NOT NULL AND NOT s.stale;
        EXIT WHEN v_gaps IS NULL;
        FOR v_company, v_at IN
            SELECT s.c, max(s.at) FROM unnest(a_company, a_period, p_at) AS s(c, p, at)
             WHERE s.c = ANY (v_gaps) AND s.p IS NULL GROUP BY s.c ORDER BY s.c
        LOOP
            PERFORM capgate_roll_company(v_company, v_at);
        END LOOP;
    END LOOP;

    -- 2. Lock (or create) every counter of the batch: company, user, then the feature counters.
    WITH slot AS (
        SELECT DISTINCT s.slot, s.c, s.p FROM unnest(a_cslot, a_company, a_period) AS s(slot, c, p) WHERE s.slot IS NOT NULL
    ), locked AS (
        INSERT INTO company_usage AS cu (company_id, period_id, used)
        SELECT slot.c, slot.p, 0 FROM slot ORDER BY slot.c, slot.p
        ON CONFLICT (company_id, period_id) DO UPDATE SET used = cu.used
        RETURNING cu.company_id, cu.period_id, cu.used, cu.cost_used, cu.cost_held, cu.rate_minute, cu.rate_calls,
                  cu.rate_tokens
    )
    SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.period_id ORDER BY slot.slot),
           array_agg(l.used ORDER BY slot.slot), array_agg(l.cost_used ORDER BY slot.slot),
           array_agg(l.cost_held ORDER BY slot.slot), array_agg(l.rate_minute ORDER BY slot.slot),
           array_agg(l.rate_calls ORDER BY slot.slot), array_agg(l.rate_tokens ORDER BY slot.slot)
      INTO c_company, c_period, c_used, c_cost, c_held, c_rmin, c_rcalls, c_rtok
      FROM slot JOIN locked l ON l.company_id = slot.c AND l.period_id = slot.p;

    WITH slot AS (
        SELECT DISTINCT s.slot, s.c, s.p, s.u
          FROM unnest(a_uslot, a_company, a_period, a_user) AS s(slot, c, p, u) WHERE s.slot IS NOT NULL
    ), locked AS (
        INSERT INTO user_usage AS uu (company_id, period_id, user_id, used)
        SELECT slot.c, slot.p, slot.u, 0 FROM slot ORDER BY slot.c, slot.p, slot.u
        ON CONFLICT (company_id, period_id, user_id) DO UPDATE SET used = uu.used
        RETURNING uu.company_id, uu.period_id, uu.user_id, uu.used, uu.cost_used, uu.cost_held, uu.rate_minute,
                  uu.rate_calls, uu.rate_tokens
    )
    SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.period_id ORDER BY slot.slot),
           array_agg(l.user_id ORDER BY slot.slot), array_agg(l.used ORDER BY slot.slot),
           array_agg(l.cost_used ORDER BY slot.slot), array_agg(l.cost_held ORDER BY slot.slot),
           array_agg(l.rate_minute ORDER BY slot.slot), array_agg(l.rate_calls ORDER BY slot.slot),
           array_agg(l.rate_tokens ORDER BY slot.slot)
      INTO u_company, u_period, u_user, u_used, u_cost, u_held, u_rmin, u_rcalls, u_rtok
      FROM slot JOIN locked l ON l.company_id = slot.c AND l.period_id = slot.p AND l.user_id = slot.u;

    IF EXISTS (SELECT 1 FROM unnest(a_fps) s WHERE s IS NOT NULL) THEN
        WITH slot AS (
            SELECT DISTINCT s.slot, s.c, s.f, s.st, s.en
              FROM unnest(a_fps, a_company, a_feature, a_start, a_end) AS s(slot, c, f, st, en) WHERE s.slot IS NOT NULL
        ), locked AS (
            INSERT INTO company_feature_usage AS fu (company_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.f, 'period', slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.f, slot.st
            ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.feature_id ORDER BY slot.slot),
               array_agg(l.starts_at ORDER BY slot.slot), array_agg(l.used ORDER BY slot.slot)
          INTO fp_company, fp_feature, fp_start, fp_used
          FROM slot JOIN locked l ON l.company_id = slot.c AND l.feature_id = slot.f AND l.starts_at = slot.st;

        WITH slot AS (
            SELECT DISTINCT s.slot, s.c, s.f, s.st, s.en
              FROM unnest(a_fds, a_company, a_feature, a_dstart, a_dend) AS s(slot, c, f, st, en) WHERE s.slot IS NOT NULL
        ), locked AS (
            INSERT INTO company_feature_usage AS fu (company_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.f, 'day', slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.f, slot.st
            ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.feature_id ORDER BY slot.slot),
               array_agg(l.starts_at ORDER BY slot.slot), array_agg(l.used ORDER BY slot.slot)
          INTO fd_company, fd_feature, fd_start, fd_used
          FROM slot JOIN locked l ON l.company_id = slot.c AND l.feature_id = slot.f AND l.starts_at = slot.st;

        WITH slot AS (
            SELECT DISTINCT s.slot, s.c, s.u, s.f, s.st, s.en
              FROM unnest(a_ups, a_company, a_user, a_feature, a_start, a_end) AS s(slot, c, u, f, st, en)
             WHERE s.slot IS NOT NULL
        ), locked AS (
            INSERT INTO user_feature_usage AS fu (company_id, user_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.u, slot.f, 'period', slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.u, slot.f, slot.st
            ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.user_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.user_id ORDER BY slot.slot),
               array_agg(l.feature_id ORDER BY slot.slot), array_agg(l.starts_at ORDER BY slot.slot),
               array_agg(l.used ORDER BY slot.slot)
          INTO up_company, up_user, up_feature, up_start, up_used
          FROM slot JOIN locked l
            ON l.company_id = slot.c AND l.user_id = slot.u AND l.feature_id = slot.f AND l.starts_at = slot.st;

        WITH slot AS (
            SELECT DISTINCT s.slot, s.c, s.u, s.f, s.st, s.en
              FROM unnest(a_uds, a_company, a_user, a_feature, a_dstart, a_dend) AS s(slot, c, u, f, st, en)
             WHERE s.slot IS NOT NULL
        ), locked AS (
            INSERT INTO user_feature_usage AS fu (company_id, user_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.u, slot.f, 'day', slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.u, slot.f, slot.st
            ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.user_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(l.company_id ORDER BY slot.slot), array_agg(l.user_id ORDER BY slot.slot),
               array_agg(l.feature_id ORDER BY slot.slot), array_agg(l.starts_at ORDER BY slot.slot),
               array_agg(l.used ORDER BY slot.slot)
          INTO ud_company, ud_user, ud_feature, ud_start, ud_used
          FROM slot JOIN locked l
            ON l.company_id = slot.c AND l.user_id = slot.u AND l.feature_id = slot.f AND l.starts_at = slot.st;
    END IF;

    -- 2b. The rate windows (SPEC §14). The plan's are in the company and user counter rows
    --     locked above; each user whose plan limits its calls in flight has its live slots
    --     counted (rate_calls, read under the user's counter lock: every admission of the user
    --     holds it when it adds a slot; the rows of p_ended are calls that ended). The windows of
    --     a feature's entitlement: its rows locked in key order (created at zero when new) and
    --     read, with the user's live slots of that feature, for step 3 to decide in memory as it
    --     decides the counters; each call's rows by index (a_wfc company x feature, a_wfu user x
    --     feature).
    IF EXISTS (SELECT 1 FROM unnest(a_uconc) c WHERE c IS NOT NULL) THEN
        SELECT array_agg(CASE WHEN x.conc THEN (SELECT count(*) FROM rate_calls rc
                                                 WHERE rc.company_id = x.c AND rc.user_id = x.u AND (rc.scopes & 4) <> 0
                                                   AND rc.lease_until > x.at AND rc.ledger_id <> ALL (p_ended))
                              END ORDER BY o)
          INTO u_slots
          FROM generate_series(1, coalesce(cardinality(u_company), 0)) o
          LEFT JOIN (SELECT s.slot, s.c, s.u, bool_or(s.conc IS NOT NULL) AS conc, min(s.at) AS at
                       FROM unnest(a_uslot, a_company, a_user, a_uconc, p_at, p_units) AS s(slot, c, u, conc, at, units)
                      WHERE s.slot IS NOT NULL AND s.units > 0
                      GROUP BY s.slot, s.c, s.u) x ON x.slot = o;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(a_fcrpm, a_fctpm, a_furpm, a_futpm, a_fconc) AS w(f, g, h, i, j)
                WHERE coalesce(w.f, w.g, w.h, w.i, w.j) IS NOT NULL) THEN
        WITH calls AS (
            SELECT s.*, o.bit, o.owner, o.feature, o.conc
              FROM unnest(a_company, a_user, a_feature, a_uslot, p_units, p_at, a_fcrpm, a_fctpm, a_furpm, a_futpm, a_fconc)
                   WITH ORDINALITY AS s(c, u, f, slot, units, at, fcrpm, fctpm, furpm, futpm, fconc, ord)
             CROSS JOIN LATERAL (VALUES
                   (8, '00000000-0000-0000-0000-000000000000'::uuid, s.f, s.fcrpm IS NOT NULL OR s.fctpm IS NOT NULL, false),
                   (16, s.u, s.f, s.furpm IS NOT NULL OR s.futpm IS NOT NULL OR s.fconc IS NOT NULL, s.fconc IS NOT NULL))
                   AS o(bit, owner, feature, applies, conc)
             WHERE o.applies AND o.feature IS NOT NULL AND s.slot IS NOT NULL AND s.units > 0
        ), keys AS (
            SELECT k.*, row_number() OVER (ORDER BY k.c, k.owner, k.feature)::integer AS idx
              FROM (SELECT c, owner, feature, min(date_trunc('minute', at, 'UTC')) AS minute, min(at) AS at,
                           bool_or(conc) AS conc
                      FROM calls GROUP BY c, owner, feature) k
        ), locked AS (
            INSERT INTO rate_windows AS w (company_id, user_id, feature_id, minute, calls, tokens)
            SELECT k.c, k.owner, k.feature, k.minute, 0, 0 FROM keys k ORDER BY k.idx
            ON CONFLICT (company_id, user_id, feature_id) DO UPDATE SET calls = w.calls
            RETURNING w.company_id, w.user_id, w.feature_id, w.minute, w.calls, w.tokens
        ), rows AS (
            SELECT k.idx, l.*,
                   -- Live slots are counted only where a concurrency limit applies.
                   CASE WHEN NOT k.conc THEN 0
                        ELSE (SELECT count(*) FROM rate_calls rc
                               WHERE rc.company_id = k.c AND rc.user_id = k.owner AND (rc.scopes & 4) <> 0
                                 AND rc.lease_until > k.at AND rc.feature_id = k.feature
                                 AND rc.ledger_id <> ALL (p_ended)) END AS slots
              FROM keys k JOIN locked l ON l.company_id = k.c AND l.user_id = k.owner AND l.feature_id = k.feature
        ), slots AS (
            SELECT c.ord, max(CASE WHEN c.bit = 8 THEN k.idx END) AS wfc, max(CASE WHEN c.bit = 16 THEN k.idx END) AS wfu
              FROM calls c JOIN keys k ON k.c = c.c AND k.owner = c.owner AND k.feature = c.feature
             GROUP BY c.ord
        )
        SELECT (SELECT array_agg(r.company_id ORDER BY r.idx) FROM rows r), (SELECT array_agg(r.user_id ORDER BY r.idx) FROM rows r),
               (SELECT array_agg(r.feature_id ORDER BY r.idx) FROM rows r), (SELECT array_agg(r.minute ORDER BY r.idx) FROM rows r),
               (SELECT array_agg(r.calls ORDER BY r.idx) FROM rows r), (SELECT array_agg(r.tokens ORDER BY r.idx) FROM rows r),
               (SELECT array_agg(r.slots ORDER BY r.idx) FROM rows r),
               (SELECT array_agg(x.wfc ORDER BY o) FROM generate_series(1, n) o LEFT JOIN slots x ON x.ord = o),
               (SELECT array_agg(x.wfu ORDER BY o) FROM generate_series(1, n) o LEFT JOIN slots x ON x.ord = o)
          INTO w_company, w_owner, w_feature, w_min, w_calls, w_tokens, w_slots, a_wfc, a_wfu;
        w_moved := array_fill(false, ARRAY[coalesce(cardinality(w_company), 0)]);
    END IF;

    -- 3. Decide in arrival order against the locked counters.
    a_decision := array_fill(NULL::text, ARRAY[n]);
    a_ledger := array_fill(NULL::bigint, ARRAY[n]);
    a_cused := array_fill(NULL::bigint, ARRAY[n]);
    a_uused := array_fill(NULL::bigint, ARRAY[n]);
    a_refused := array_fill(NULL::text, ARRAY[n]);
    a_fday := array_fill(NULL::timestamptz, ARRAY[n]);
    a_fpu := array_fill(NULL::bigint, ARRAY[n]);
    a_fdu := array_fill(NULL::bigint, ARRAY[n]);
    a_upu := array_fill(NULL::bigint, ARRAY[n]);
    a_udu := array_fill(NULL::bigint, ARRAY[n]);
    a_scope := array_fill(NULL::text, ARRAY[n]);
    a_ccu := array_fill(NULL::bigint, ARRAY[n]);
    a_cch := array_fill(NULL::bigint, ARRAY[n]);
    a_ucu := array_fill(NULL::bigint, ARRAY[n]);
    a_uch := array_fill(NULL::bigint, ARRAY[n]);
    a_rref := array_fill(NULL::text, ARRAY[n]);
    a_rmin := array_fill(NULL::timestamptz, ARRAY[n]);
    a_rscopes := array_fill(NULL::smallint, ARRAY[n]);
    a_crc := array_fill(NULL::bigint, ARRAY[n]);
    a_crt := array_fill(NULL::bigint, ARRAY[n]);
    a_urc := array_fill(NULL::bigint, ARRAY[n]);
    a_urt := array_fill(NULL::bigint, ARRAY[n]);
    a_us := array_fill(NULL::bigint, ARRAY[n]);
    a_fcrc := array_fill(NULL::bigint, ARRAY[n]);
    a_fcrt := array_fill(NULL::bigint, ARRAY[n]);
    a_furc := array_fill(NULL::bigint, ARRAY[n]);
    a_furt := array_fill(NULL::bigint, ARRAY[n]);
    a_fus := array_fill(NULL::bigint, ARRAY[n]);
    a_gu := array_fill(NULL::bigint, ARRAY[n]);
    a_gc := array_fill(NULL::bigint, ARRAY[n]);
    a_gup := array_fill(NULL::bigint, ARRAY[n]);
    a_gcp := array_fill(NULL::bigint, ARRAY[n]);
    FOR i IN 1..n LOOP
        CONTINUE WHEN a_auth[i] <> 'ok';
        IF a_stale[i] THEN
            a_decision[i] := 'stale_routes';
            CONTINUE;
        ELSIF a_period[i] IS NULL THEN
            a_decision[i] := 'no_active_plan';
            CONTINUE;
        ELSIF NOT a_user_ok[i] THEN
            a_decision[i] := 'unknown_user';
            CONTINUE;
        ELSIF a_feature[i] IS NOT NULL AND NOT coalesce(a_factive[i], false) THEN
            a_decision[i] := 'unknown_feature';
            CONTINUE;
        ELSIF NOT a_bound[i] THEN
            a_decision[i] := 'feature_not_bound';
            CONTINUE;
        ELSIF a_feature[i] IS NOT NULL AND NOT coalesce(a_fenabled[i], false) THEN
            a_decision[i] := 'feature_not_in_plan';
            -- Its 402's usage shows the counters as they stand (SPEC §3), unchanged.
            a_cused[i] := c_used[a_cslot[i]]; a_uused[i] := u_used[a_uslot[i]];
            a_ccu[i] := c_cost[a_cslot[i]]; a_cch[i] := c_held[a_cslot[i]];
            a_ucu[i] := u_cost[a_uslot[i]]; a_uch[i] := u_held[a_uslot[i]];
            CONTINUE;
        ELSIF p_units[i] > 0 AND (a_cbudget[i] IS NOT NULL OR a_ubudget[i] IS NOT NULL)
              AND (NOT a_priced[i] OR p_prompt[i] < -1 OR p_max_tokens[i] < 0) THEN
            a_decision[i] := CASE WHEN p_prompt[i] < -1 THEN 'unbounded_call' WHEN NOT a_priced[i] THEN 'unpriced_model'
                                  ELSE 'max_tokens_required' END;
            CONTINUE;
        ELSIF p_units[i] > 0 AND (a_rtok[i] IS NULL OR NOT a_priced[i])
              AND (a_ctpm[i] IS NOT NULL OR a_utpm[i] IS NOT NULL OR a_fctpm[i] IS NOT NULL OR a_futpm[i] IS NOT NULL) THEN
            -- A token window, as a budget, bounds only a priced call (SPEC §11: fail closed).
            a_decision[i] := CASE WHEN p_prompt[i] < -1 THEN 'unbounded_call' WHEN NOT a_priced[i] THEN 'unpriced_model'
                                  WHEN p_max_tokens[i] < 0 THEN 'max_tokens_required' ELSE 'unbounded_call' END;
            CONTINUE;
        END IF;
        cs := a_cslot[i]; us := a_uslot[i];
        fps := a_fps[i]; fds := a_fds[i]; ups := a_ups[i]; uds := a_uds[i];
        u := p_units[i];
        h := CASE WHEN u > 0 THEN coalesce(a_hold[i], 0) ELSE 0 END;
        g_cap := u > 0 AND a_ccap[i] IS NOT NULL AND c_used[cs] + u > a_ccap[i];
        g_budget := u > 0 AND a_cbudget[i] IS NOT NULL AND c_cost[cs] + c_held[cs] + h > a_cbudget[i];
        g_units := NULL; g_cost := NULL;
        g_up := CASE WHEN g_cap THEN u - greatest(a_ccap[i] - c_used[cs], 0) END;
        g_cp := CASE WHEN g_budget THEN h - greatest(a_cbudget[i] - c_cost[cs] - c_held[cs], 0) END;
        IF g_cap OR g_budget THEN
            SELECT t.units_grant, t.cost_grant INTO g_units, g_cost
              FROM capgate_grant_take(a_company[i], p_at[i], g_up, g_cp, 'lock') t;
        END IF;
        IF u > 0 AND a_ccap[i] IS NOT NULL AND c_used[cs] + u > a_ccap[i] AND g_units IS NULL THEN
            a_decision[i] := 'company_cap';
        ELSIF u > 0 AND a_ucap[i] IS NOT NULL AND u_used[us] + u > a_ucap[i] THEN
            a_decision[i] := 'user_cap';
        ELSIF fps IS NOT NULL AND a_lp[i] IS NOT NULL AND fp_used[fps] + u > a_lp[i] THEN
            a_decision[i] := 'feature_limit_exceeded';
            a_refused[i] := 'company.period';
        ELSIF fds IS NOT NULL AND a_ld[i] IS NOT NULL AND fd_used[fds] + u > a_ld[i] THEN
            a_decision[i] := 'feature_limit_exceeded';
            a_refused[i] := 'company.day';
        ELSIF ups IS NOT NULL AND a_lup[i] IS NOT NULL AND up_used[ups] + u > a_lup[i] THEN
            a_decision[i] := 'feature_limit_exceeded';
            a_refused[i] := 'user.period';
        ELSIF uds IS NOT NULL AND a_lud[i] IS NOT NULL AND ud_used[uds] + u > a_lud[i] THEN
            a_decision[i] := 'feature_limit_exceeded';
            a_refused[i] := 'user.day';
        ELSIF u > 0 AND a_cbudget[i] IS NOT NULL AND c_cost[cs] + c_held[cs] + h > a_cbudget[i] AND g_cost IS NULL THEN
            a_decision[i] := 'budget_exceeded';
            a_scope[i] := 'company';
        ELSIF u > 0 AND a_ubudget[i] IS NOT NULL AND u_cost[us] + u_held[us] + h > a_ubudget[i] THEN
            a_decision[i] := 'budget_exceeded';
            a_scope[i] := 'user';
        ELSE
            a_decision[i] := 'charged';
        END IF;
        -- The rate windows (SPEC §14) of a call every counter takes.
        v_windows := a_crpm[i] IS NOT NULL OR a_ctpm[i] IS NOT NULL OR a_urpm[i] IS NOT NULL OR a_utpm[i] IS NOT NULL
                     OR a_uconc[i] IS NOT NULL OR a_fcrpm[i] IS NOT NULL OR a_fctpm[i] IS NOT NULL OR a_furpm[i] IS NOT NULL
                     OR a_futpm[i] IS NOT NULL OR a_fconc[i] IS NOT NULL;
        IF a_decision[i] = 'charged' AND u > 0 AND v_windows THEN
            -- As capgate_rate_take, in memory: the owners in its order (company, company x
            -- feature, user, user x feature); the first window that does not fit refuses, and the
            -- counts of the owners read so far stand as they are; else every one takes the call.
            -- A plan counter row on an earlier minute starts again (from what the periods before
            -- took in this minute when its period started inside it: capgate_rate_carry).
            a_rtok[i] := coalesce(a_rtok[i], 0);
            v_minute := date_trunc('minute', p_at[i], 'UTC');
            a_rmin[i] := v_minute;
            v_ref := NULL;
            v_scopes := 0;
            v_slot := a_uconc[i] IS NOT NULL OR a_fconc[i] IS NOT NULL;
            FOR o IN 1..4 LOOP
                v_rpm := (ARRAY[a_crpm[i], a_fcrpm[i], a_urpm[i], a_furpm[i]])[o];
                v_tpm := (ARRAY[a_ctpm[i], a_fctpm[i], a_utpm[i], a_futpm[i]])[o];
                v_conc := (ARRAY[NULL, NULL, a_uconc[i], a_fconc[i]]::bigint[])[o];
                CONTINUE WHEN v_rpm IS NULL AND v_tpm IS NULL AND v_conc IS NULL;
                IF o = 1 THEN
                    IF c_rmin[cs] IS NULL OR c_rmin[cs] < v_minute THEN
                        SELECT x.calls, x.tokens INTO v_c, v_t FROM capgate_rate_carry(a_company[i], NULL, a_start[i], v_minute) x;
                        c_rmin[cs] := v_minute; c_rcalls[cs] := v_c; c_rtok[cs] := v_t;
                    END IF;
                    v_c := c_rcalls[cs]; v_t := c_rtok[cs]; v_s := NULL;
                ELSIF o = 3 THEN
                    IF u_rmin[us] IS NULL OR u_rmin[us] < v_minute THEN
                        SELECT x.calls, x.tokens INTO v_c, v_t FROM capgate_rate_carry(a_company[i], a_user[i], a_start[i], v_minute) x;
                        u_rmin[us] := v_minute; u_rcalls[us] := v_c; u_rtok[us] := v_t;
                    END IF;
                    v_c := u_rcalls[us]; v_t := u_rtok[us]; v_s := u_slots[us];
                ELSE
                    v_k := CASE o WHEN 2 THEN a_wfc[i] ELSE a_wfu[i] END;
                    v_c := CASE WHEN w_min[v_k] >= v_minute THEN w_calls[v_k] ELSE 0 END;
                    v_t := CASE WHEN w_min[v_k] >= v_minute THEN w_tokens[v_k] ELSE 0 END;
                    v_s := w_slots[v_k];
                END IF;
                v_ref := CASE WHEN v_rpm IS NOT NULL AND v_c + 1 > v_rpm THEN '-rpm'
                              WHEN v_tpm IS NOT NULL AND v_t + a_rtok[i] > v_tpm THEN '-tpm'
                              WHEN v_conc IS NOT NULL AND v_s >= v_conc THEN '-concurrency' END;
                -- The owner's counts as they stand (the call is added below once every window took it).
                CASE o
                    WHEN 1 THEN a_crc[i] := v_c; a_crt[i] := v_t;
                    WHEN 2 THEN a_fcrc[i] := v_c; a_fcrt[i] := v_t;
                    WHEN 3 THEN a_urc[i] := v_c; a_urt[i] := v_t;
                        a_us[i] := CASE WHEN v_conc IS NOT NULL AND coalesce(v_ref, '-concurrency') = '-concurrency'
                                        THEN v_s END;
                    ELSE a_furc[i] := v_c; a_furt[i] := v_t;
                        a_fus[i] := CASE WHEN v_conc IS NOT NULL AND coalesce(v_ref, '-concurrency') = '-concurrency'
                                         THEN v_s END;
                END CASE;
                IF v_ref IS NOT NULL THEN
                    v_ref := (ARRAY['company', 'feature.company', 'user', 'feature.user'])[o] || v_ref;
                    EXIT;
                END IF;
                v_scopes := v_scopes | (ARRAY[1, 8, 2, 16])[o];
            END LOOP;
            IF v_ref IS NULL THEN
                IF (v_scopes & 1) <> 0 THEN a_crc[i] := a_crc[i] + 1; a_crt[i] := a_crt[i] + a_rtok[i]; END IF;
                IF (v_scopes & 8) <> 0 THEN a_fcrc[i] := a_fcrc[i] + 1; a_fcrt[i] := a_fcrt[i] + a_rtok[i]; END IF;
                IF (v_scopes & 2) <> 0 THEN
                    a_urc[i] := a_urc[i] + 1; a_urt[i] := a_urt[i] + a_rtok[i]; a_us[i] := a_us[i] + 1;
                END IF;
                IF (v_scopes & 16) <> 0 THEN
                    a_furc[i] := a_furc[i] + 1; a_furt[i] := a_furt[i] + a_rtok[i]; a_fus[i] := a_fus[i] + 1;
                END IF;
            END IF;
            IF v_ref IS NOT NULL THEN
                a_decision[i] := 'rate_limited';
                a_rref[i] := v_ref;
            ELSE
                -- Taken: every window of the call moves, and a slot counts for the user's.
                IF (v_scopes & 1) <> 0 THEN
                    c_rcalls[cs] := c_rcalls[cs] + 1; c_rtok[cs] := c_rtok[cs] + a_rtok[i];
                END IF;
                IF (v_scopes & 2) <> 0 THEN
                    u_rcalls[us] := u_rcalls[us] + 1; u_rtok[us] := u_rtok[us] + a_rtok[i];
                END IF;
                IF v_slot AND u_slots IS NOT NULL THEN
                    u_slots[us] := u_slots[us] + 1;
                END IF;
                FOREACH v_k IN ARRAY ARRAY[a_wfc[i], a_wfu[i]] LOOP
                    CONTINUE WHEN v_k IS NULL;
                    IF w_min[v_k] < v_minute THEN
                        w_calls[v_k] := 0;
                        w_tokens[v_k] := 0;
                        w_min[v_k] := v_minute;
                    END IF;
                    w_calls[v_k] := w_calls[v_k] + 1;
                    w_tokens[v_k] := w_tokens[v_k] + a_rtok[i];
                    w_slots[v_k] := w_slots[v_k] + CASE WHEN v_slot THEN 1 ELSE 0 END;
                    w_moved[v_k] := true;
                END LOOP;
                a_rscopes[i] := v_scopes | CASE WHEN v_slot THEN 4 ELSE 0 END;
            END IF;
        ELSE
            a_rtok[i] := NULL;
        END IF;
        IF a_decision[i] = 'charged' THEN
            c_used[cs] := c_used[cs] + u;
            u_used[us] := u_used[us] + u;
            c_held[cs] := c_held[cs] + h;
            u_held[us] := u_held[us] + h;
            IF g_cap OR g_budget THEN
                SELECT t.units_grant, t.cost_grant, t.taken INTO g_units, g_cost, g_taken
                  FROM capgate_grant_take(a_company[i], p_at[i], g_up, g_cp, 'take') t;
                IF NOT g_taken THEN
                    RAISE EXCEPTION 'capgate_admit_batch: a top-up grant locked for call % was not found again', i;
                END IF;
                a_gu[i] := g_units;
                a_gc[i] := g_cost;
                a_gup[i] := g_up;
                a_gcp[i] := g_cp;
                c_used[cs] := c_used[cs] - coalesce(g_up, 0);
                c_held[cs] := c_held[cs] - coalesce(g_cp, 0);
            END IF;
            IF fps IS NOT NULL THEN
                fp_used[fps] := fp_used[fps] + u;
                fd_used[fds] := fd_used[fds] + u;
                up_used[ups] := up_used[ups] + u;
                ud_used[uds] := ud_used[uds] + u;
                a_fday[i] := a_dstart[i];
            END IF;
            a_decision[i] := 'charged';
            a_ledger[i] := nextval('usage_ledger_id_seq'::regclass);
            -- Threshold notifications (SPEC §9), only for a counter at or past the lowest threshold.
            IF v_low IS NOT NULL AND u > 0 THEN
                IF a_ccap[i] IS NOT NULL AND c_used[cs] * 100 >= v_low::bigint * a_ccap[i] THEN
                    PERFORM capgate_notify(a_company[i], NULL, NULL, 'period', a_start[i], a_end[i], c_used[cs], u, a_ccap[i],
                                           v_thresholds);
                END IF;
                IF a_ucap[i] IS NOT NULL AND u_used[us] * 100 >= v_low::bigint * a_ucap[i] THEN
                    PERFORM capgate_notify(a_company[i], a_user[i], NULL, 'period', a_start[i], a_end[i], u_used[us], u,
                                           a_ucap[i], v_thresholds);
                END IF;
                IF fps IS NOT NULL THEN
                    IF a_lp[i] IS NOT NULL AND fp_used[fps] * 100 >= v_low::bigint * a_lp[i] THEN
                        PERFORM capgate_notify(a_company[i], NULL, a_feature[i], 'period', a_start[i], a_end[i], fp_used[fps], u,
                                               a_lp[i], v_thresholds);
                    END IF;
                    IF a_ld[i] IS NOT NULL AND fd_used[fds] * 100 >= v_low::bigint * a_ld[i] THEN
                        PERFORM capgate_notify(a_company[i], NULL, a_feature[i], 'day', a_dstart[i], a_dend[i], fd_used[fds], u,
                                               a_ld[i], v_thresholds);
                    END IF;
                    IF a_lup[i] IS NOT NULL AND up_used[ups] * 100 >= v_low::bigint * a_lup[i] THEN
                        PERFORM capgate_notify(a_company[i], a_user[i], a_feature[i], 'period', a_start[i], a_end[i], up_used[ups],
                                               u, a_lup[i], v_thresholds);
                    END IF;
                    IF a_lud[i] IS NOT NULL AND ud_used[uds] * 100 >= v_low::bigint * a_lud[i] THEN
                        PERFORM capgate_notify(a_company[i], a_user[i], a_feature[i], 'day', a_dstart[i], a_dend[i], ud_used[uds],
                                               u, a_lud[i], v_thresholds);
                    END IF;
                END IF;
            END IF;
        END IF;
        a_cused[i] := c_used[cs];
        a_uused[i] := u_used[us];
        a_ccu[i] := c_cost[cs]; a_cch[i] := c_held[cs];
        a_ucu[i] := u_cost[us]; a_uch[i] := u_held[us];
        IF fps IS NOT NULL THEN
            a_fpu[i] := fp_used[fps]; a_fdu[i] := fd_used[fds]; a_upu[i] := up_used[ups]; a_udu[i] := ud_used[uds];
        END IF;
    END LOOP;

    -- 4. Write the counters that moved and the ledger rows of the charged calls.
    IF w_company IS NOT NULL THEN
        UPDATE rate_windows rw SET minute = s.m, calls = s.calls, tokens = s.tokens
          FROM unnest(w_company, w_owner, w_feature, w_min, w_calls, w_tokens, w_moved) AS s(c, o, f, m, calls, tokens, moved)
         WHERE s.moved AND rw.company_id = s.c AND rw.user_id = s.o AND rw.feature_id = s.f;
    END IF;
    -- The charged calls holding a concurrency slot, until their end (capgate_rate_end) or lease.
    IF EXISTS (SELECT 1 FROM unnest(a_rscopes) r WHERE (r & 4) <> 0) THEN
        INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
        SELECT s.c, s.ledger, s.u, coalesce(s.f, ''), s.m, s.tok, s.scopes, s.at + make_interval(secs => v_lease)
          FROM unnest(a_company, a_ledger, a_user, a_feature, a_rmin, a_rtok, a_rscopes, p_at, a_decision)
               AS s(c, ledger, u, f, m, tok, scopes, at, decision)
         WHERE s.decision = 'charged' AND (s.scopes & 4) <> 0;
    END IF;
    UPDATE company_usage cu SET used = s.used, cost_held = s.held, rate_minute = s.rmin, rate_calls = s.rcalls,
                                rate_tokens = s.rtok
      FROM unnest(c_company, c_period, c_used, c_held, c_rmin, c_rcalls, c_rtok) AS s(c, p, used, held, rmin, rcalls, rtok)
     WHERE cu.company_id = s.c AND cu.period_id = s.p
       AND (cu.used <> s.used OR cu.cost_held <> s.held OR cu.rate_calls <> s.rcalls OR cu.rate_tokens <> s.rtok
            OR cu.rate_minute IS DISTINCT FROM s.rmin);
    UPDATE user_usage uu SET used = s.used, cost_held = s.held, rate_minute = s.rmin, rate_calls = s.rcalls,
                             rate_tokens = s.rtok
      FROM unnest(u_company, u_period, u_user, u_used, u_held, u_rmin, u_rcalls, u_rtok)
           AS s(c, p, u, used, held, rmin, rcalls, rtok)
     WHERE uu.company_id = s.c AND uu.period_id = s.p AND uu.user_id = s.u
       AND (uu.used <> s.used OR uu.cost_held <> s.held OR uu.rate_calls <> s.rcalls OR uu.rate_tokens <> s.rtok
            OR uu.rate_minute IS DISTINCT FROM s.rmin);
    IF fp_company IS NOT NULL THEN
        UPDATE company_feature_usage fu SET used = s.used
          FROM unnest(fp_company, fp_feature, fp_start, fp_used) AS s(c, f, st, used)
         WHERE fu.company_id = s.c AND fu.feature_id = s.f AND fu.span = 'period' AND fu.starts_at = s.st
           AND fu.used <> s.used;
        UPDATE company_feature_usage fu SET used = s.used
          FROM unnest(fd_company, fd_feature, fd_start, fd_used) AS s(c, f, st, used)
         WHERE fu.company_id = s.c AND fu.feature_id = s.f AND fu.span = 'day' AND fu.starts_at = s.st
           AND fu.used <> s.used;
        UPDATE user_feature_usage fu SET used = s.used
          FROM unnest(up_company, up_user, up_feature, up_start, up_used) AS s(c, u, f, st, used)
         WHERE fu.company_id = s.c AND fu.user_id = s.u AND fu.feature_id = s.f AND fu.span = 'period'
           AND fu.starts_at = s.st AND fu.used <> s.used;
        UPDATE user_feature_usage fu SET used = s.used
          FROM unnest(ud_company, ud_user, ud_feature, ud_start, ud_used) AS s(c, u, f, st, used)
         WHERE fu.company_id = s.c AND fu.user_id = s.u AND fu.feature_id = s.f AND fu.span = 'day'
           AND fu.starts_at = s.st AND fu.used <> s.used;
    END IF;
    INSERT INTO usage_ledger (id, company_id, period_id, user_id, units, method, route, model, feature, feature_day,
                              request_id, outcome, created_at, hold_micros, units_grant_id, cost_grant_id, rate_minute, rate_tokens,
                              rate_scopes, units_grant_part, cost_grant_part)
    OVERRIDING SYSTEM VALUE
    SELECT s.id, s.c, s.p, s.u, s.units, s.method, s.route, nullif(s.model, ''), nullif(s.feature, ''), s.fday,
           s.request_id, 'charged', s.at, CASE WHEN s.units > 0 THEN s.hold END, s.gu, s.gc, s.rmin, s.rtok, s.rscopes,
           s.gup, s.gcp
      FROM unnest(a_ledger, a_company, a_period, a_user, p_units, p_method, p_route, p_model, p_feature, a_fday,
                  p_request_id, p_at, a_decision, a_hold, a_gu, a_gc, a_rmin, a_rtok, a_rscopes, a_gup, a_gcp)
           AS s(id, c, p, u, units, method, route, model, feature, fday, request_id, at, decision, hold, gu, gc, rmin, rtok,
                rscopes, gup, gcp)
     WHERE s.decision = 'charged';

    -- 5. One row per call, in the order given.
    RETURN QUERY
        SELECT s.ord::integer, s.auth, CASE WHEN s.auth = 'ok' THEN s.c END, CASE WHEN s.auth = 'ok' THEN s.u END,
               CASE WHEN s.auth = 'ok' THEN s.role END, s.decision, s.ledger, s.period, s.plan, s.plan_name,
               s.started, s.ends, s.cused, s.ccap, s.uused, s.ucap,
               s.feature, s.fname, s.refused, s.fmsg, s.dstart, s.dend,
               s.fpu, s.lp, s.fdu, s.ld, s.upu, s.lup, s.udu, s.lud,
               NULL::integer, NULL::text, NULL::bytea, o.plan_id, o.company_cap, o.user_cap, o.feature_limit,
               CASE WHEN s.decision IN ('charged', 'company_cap', 'user_cap', 'feature_limit_exceeded', 'budget_exceeded',
                                        'rate_limited')
                    THEN s.hold END,
               s.scope, s.ccu, s.cch, s.cbudget, s.ucu, s.uch, s.ubudget,
               s.rref, s.rmin, s.rtok, s.crpm, s.ctpm, s.urpm, s.utpm, s.uconc, s.crc, s.crt, s.urc, s.urt, s.us,
               s.fcrpm, s.fctpm, s.furpm, s.futpm, s.fconc, s.fcrc, s.fcrt, s.furc, s.furt, s.fus
          FROM unnest(a_auth, a_company, a_user, a_role, a_decision, a_ledger, a_period, a_plan, a_plan_name,
                      a_start, a_end, a_cused, a_ccap, a_uused, a_ucap,
                      a_feature, a_fname, a_refused, a_fmsg, a_dstart, a_dend,
                      a_fpu, a_lp, a_fdu, a_ld, a_upu, a_lup, a_udu, a_lud,
                      a_hold, a_scope, a_ccu, a_cch, a_cbudget, a_ucu, a_uch, a_ubudget,
                      a_rref, a_rmin, a_rtok, a_crpm, a_ctpm, a_urpm, a_utpm, a_uconc, a_crc, a_crt, a_urc, a_urt, a_us,
                      a_fcrpm, a_fctpm, a_furpm, a_futpm, a_fconc, a_fcrc, a_fcrt, a_furc, a_furt, a_fus)
               WITH ORDINALITY AS s(auth, c, u, role, decision, ledger, period, plan, plan_name, started, ends,
                                    cused, ccap, uused, ucap, feature, fname, refused, fmsg, dstart, dend,
                                    fpu, lp, fdu, ld, upu, lup, udu, lud,
                                    hold, scope, ccu, cch, cbudget, ucu, uch, ubudget,
                                    rref, rmin, rtok, crpm, ctpm, urpm, utpm, uconc, crc, crt, urc, urt, us,
                                    fcrpm, fctpm, furpm, futpm, fconc, fcrc, fcrt, furc, furt, fus, ord)
          -- A refusal's upgrade offer (the one-time filter skips the lookup for every other call).
          LEFT JOIN LATERAL (
              SELECT * FROM capgate_upgrade_offer(s.decision, s.plan, s.feature, s.refused,
                                                  CASE s.refused WHEN 'company.period' THEN s.lp WHEN 'company.day' THEN s.ld
                                                                 WHEN 'user.period' THEN s.lup WHEN 'user.day' THEN s.lud END)
               WHERE s.decision IN ('company_cap', 'user_cap', 'no_active_plan', 'feature_not_in_plan',
                                    'feature_limit_exceeded')
          ) o ON true;
END;
$$;
