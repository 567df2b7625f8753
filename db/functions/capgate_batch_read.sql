-- Step 1 of capgate_admit_batch: the calls as the database knows them, one capgate_batch_call
-- each, in the order given. Each call's period is locked FOR KEY SHARE as it is read, before any
-- counter (capgate_batch_lock). The arguments are capgate_admit_batch's; p_routes: the route
-- table's version (a call matched against another is stale); p_models, p_prices, p_exact: the
-- batch's models priced once (capgate_admit_batch), a call of a model not exact looked up alone.
-- A call reaches the counters (cslot, uslot) when its user is known and enabled, its company has
-- a period, its routes are current and its key not revoked; the feature counters (fps .. uds) when
-- it also names an active feature of its plan that its key may be charged to and has units. Each
-- kind of counter is numbered in its key order, the order capgate_batch_lock locks them in.
CREATE FUNCTION capgate_batch_read(
    p_key_hash bytea[], p_company uuid[], p_user uuid[], p_units integer[], p_method text[], p_route text[],
    p_model text[], p_feature text[], p_request_id text[], p_routes_version bigint[], p_at timestamptz[],
    p_prompt bigint[], p_max_tokens bigint[], p_cache smallint[], p_window bigint[],
    p_routes bigint, p_models text[], p_prices prices[], p_exact boolean[]
) RETURNS capgate_batch_call[]
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_calls capgate_batch_call[];
BEGIN
    SELECT array_agg(ROW(r.ord, r.at, r.units, r.method, r.route, r.model, r.feature, r.request_id, r.prompt, r.max_tokens,
                         r.auth, r.company, r.member, r.role, r.user_ok, r.stale,
                         r.period, r.plan, r.plan_name, r.started_at, r.ends_at, r.ccap, r.ucap, r.cbudget, r.ubudget,
                         CASE WHEN r.eligible THEN r.cslot END, CASE WHEN r.eligible THEN r.uslot END,
                         CASE WHEN r.fe THEN r.fps END, CASE WHEN r.fe THEN r.fds END,
                         CASE WHEN r.fe THEN r.ups END, CASE WHEN r.fe THEN r.uds END,
                         r.fname, r.factive, r.fenabled, r.fmsg, r.bound, r.lp, r.ld, r.lup, r.lud, r.dstart, r.dend,
                         r.priced, r.hold, r.rtok, r.crpm, r.ctpm, r.urpm, r.utpm, r.uconc,
                         r.fcrpm, r.fctpm, r.furpm, r.futpm, r.fconc)::capgate_batch_call ORDER BY r.ord)
      INTO v_calls
      FROM (
        SELECT y.*,
               dense_rank() OVER (PARTITION BY y.eligible ORDER BY y.company, y.period)::integer AS cslot,
               dense_rank() OVER (PARTITION BY y.eligible ORDER BY y.company, y.period, y.member)::integer AS uslot,
               dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.feature, y.started_at)::integer AS fps,
               dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.feature, y.dstart)::integer AS fds,
               dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.member, y.feature, y.started_at)::integer AS ups,
               dense_rank() OVER (PARTITION BY y.fe ORDER BY y.company, y.member, y.feature, y.dstart)::integer AS uds
          FROM (
            SELECT x.*,
                   (x.eligible AND x.feature IS NOT NULL AND coalesce(x.factive, false) AND coalesce(x.fenabled, false)
                    AND x.bound AND x.units > 0) AS fe,
                   CASE WHEN x.feature IS NOT NULL AND x.period IS NOT NULL THEN capgate_day_start(x.at, x.zone) END AS dstart,
                   CASE WHEN x.feature IS NOT NULL AND x.period IS NOT NULL THEN capgate_day_end(x.at, x.zone) END AS dend
              FROM (
                SELECT i.ord, i.at, i.units, i.method, i.route, i.model, i.feature, i.request_id, i.prompt, i.max_tokens,
                       i.stale,
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
                       CASE WHEN p.id IS NULL THEN NULL ELSE coalesce(u.monthly_budget, p.monthly_user_budget) END AS ubudget,
                       (pr.q).model IS NOT NULL AS priced,
                       capgate_hold(pr.q, i.prompt, i.max_tokens, i.cache, i.window) AS hold,
                       p.company_rpm AS crpm, p.company_tpm AS ctpm, p.user_rpm AS urpm, p.user_tpm AS utpm,
                       p.user_concurrency AS uconc, capgate_rate_tokens(pr.q, i.prompt, i.max_tokens, i.window) AS rtok,
                       e.company_rpm AS fcrpm, e.company_tpm AS fctpm, e.user_rpm AS furpm, e.user_tpm AS futpm,
                       e.user_concurrency AS fconc
                  FROM unnest(p_key_hash, p_company, p_user, p_at, p_units, p_feature, p_routes_version, p_model,
                              p_prompt, p_max_tokens, p_cache, p_window, p_method, p_route, p_request_id)
                       WITH ORDINALITY AS i0(kh, co, us, at, units, feature, version, model, prompt, max_tokens, cache,
                                             window_, method, route, request_id, ord)
                 CROSS JOIN LATERAL (
                    SELECT nullif(i0.kh, ''::bytea) AS kh,
                           nullif(i0.co, '00000000-0000-0000-0000-000000000000'::uuid) AS co,
                           nullif(i0.us, '00000000-0000-0000-0000-000000000000'::uuid) AS us,
                           i0.at, i0.units, nullif(i0.feature, '') AS feature,
                           (i0.version >= 0 AND i0.version <> p_routes) AS stale, i0.ord::integer AS ord,
                           nullif(i0.model, '') AS model, i0.prompt, i0.max_tokens, i0.cache, i0.window_ AS window,
                           i0.method, i0.route, i0.request_id
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
                    SELECT CASE WHEN x.k IS NULL THEN NULL WHEN p_exact[x.k] THEN p_prices[x.k]
                                ELSE (SELECT q FROM capgate_price(i.model, i.at) q) END AS q
                      FROM (SELECT array_position(p_models, i.model) AS k) x
                     WHERE i.units > 0
                  ) pr ON true
              ) x
          ) y
      ) r;
    RETURN v_calls;
END;
$$;
