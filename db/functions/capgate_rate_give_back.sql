-- Writes token holds that settlements gave back in the plan windows (SPEC §14; capgate_settle_batch
-- with p_defer returns them to the gateway) in their own transaction: those no admission of the
-- gateway carried within a few milliseconds (capgate_rate_end). One element per counter row and
-- minute: p_user the nil UUID for the company's row, p_tokens negative (what the calls' real
-- counts left of their holds).
--
-- The rows are locked as an admission locks them: the company counters in key order, then the
-- user counters in key order (each user is one company's), so this never waits in a cycle with
-- an admission or a settlement. A row already on a later minute keeps its count (its window
-- started again); of one row's elements only its latest minute's can still apply. A row never
-- goes below zero.
CREATE FUNCTION capgate_rate_give_back(
    p_company uuid[], p_period bigint[], p_user uuid[], p_minute timestamptz[], p_tokens bigint[]
) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- Key lookups only (see capgate_settle_batch.sql).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    PERFORM 1
       FROM (SELECT DISTINCT g.c, g.p FROM unnest(p_company, p_period) AS g(c, p)) k
       JOIN company_usage cu ON cu.company_id = k.c AND cu.period_id = k.p
      ORDER BY cu.company_id, cu.period_id
        FOR UPDATE OF cu;
    UPDATE company_usage cu SET rate_tokens = greatest(cu.rate_tokens + g.t, 0)
      FROM (SELECT g.c, g.p, g.m, sum(g.t)::bigint AS t
              FROM unnest(p_company, p_period, p_user, p_minute, p_tokens) AS g(c, p, u, m, t)
             WHERE g.u = '00000000-0000-0000-0000-000000000000'
             GROUP BY g.c, g.p, g.m) g
     WHERE cu.company_id = g.c AND cu.period_id = g.p AND cu.rate_minute = g.m;
    PERFORM 1
       FROM (SELECT DISTINCT g.c, g.p, g.u FROM unnest(p_company, p_period, p_user) AS g(c, p, u)
              WHERE g.u <> '00000000-0000-0000-0000-000000000000') k
       JOIN user_usage uu ON uu.company_id = k.c AND uu.period_id = k.p AND uu.user_id = k.u
      ORDER BY uu.company_id, uu.period_id, uu.user_id
        FOR UPDATE OF uu;
    UPDATE user_usage uu SET rate_tokens = greatest(uu.rate_tokens + g.t, 0)
      FROM (SELECT g.c, g.p, g.u, g.m, sum(g.t)::bigint AS t
              FROM unnest(p_company, p_period, p_user, p_minute, p_tokens) AS g(c, p, u, m, t)
             WHERE g.u <> '00000000-0000-0000-0000-000000000000'
             GROUP BY g.c, g.p, g.u, g.m) g
     WHERE uu.company_id = g.c AND uu.period_id = g.p AND uu.user_id = g.u AND uu.rate_minute = g.m;
END;
$$;
