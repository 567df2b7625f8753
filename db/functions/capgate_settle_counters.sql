-- The counters' side of a settlement (capgate_settle_batch, after its ledger rows are settled and
-- locked): the company counters whose cost or tokens move are locked in key order, then the
-- company and user counters, top-up grants and a feature's rate_windows rows trade each call's
-- hold (cost, and tokens in a token window) for what was settled, in one statement. One array
-- element per settled call (m_open: its cost hold was open; m_tok: the change of its tokens in
-- its windows, NULL for none; the rest as capgate_settle_batch's RETURNING names them).
--
-- Planned once per connection (generic plans), unlike capgate_settle_batch: these statements
-- read no ledger row, only counters, grants and window rows by key, driven from the arrays (nested
-- loops only, no sequential scan: a plan made while those tables were empty stays key lookups,
-- PlanStabilityTests). Planning them for every batch was a third of a settlement's time with token
-- windows (about 4 ms a batch of ~115 calls at concurrency 64, measured in session 28).
CREATE FUNCTION capgate_settle_counters(
    m_company uuid[], m_period bigint[], m_user uuid[], m_grant bigint[], m_open boolean[], m_hold bigint[],
    m_cost bigint[], m_part bigint[], m_feature text[], m_minute timestamptz[], m_scopes smallint[], m_tok bigint[]
) RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- Key lookups only (see capgate_settle_batch.sql).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
DECLARE
    v_n bigint;
BEGIN
    -- 1. The company counters whose cost or tokens move, in key order (as an admission takes them).
    PERFORM 1
       FROM (SELECT DISTINCT m.c, m.p
               FROM unnest(m_company, m_period, m_open, m_hold, m_cost, m_tok) AS m(c, p, open, hold, cost, tok)
              WHERE (m.open AND (m.hold IS NOT NULL OR m.cost IS NOT NULL)) OR m.tok IS NOT NULL) k
       JOIN company_usage cu ON cu.company_id = k.c AND cu.period_id = k.p
      ORDER BY cu.company_id, cu.period_id
        FOR UPDATE OF cu;
    -- 2. The counters, grants and feature windows trade the holds for what was settled.
    WITH settled AS (
        SELECT *
          FROM unnest(m_company, m_period, m_user, m_grant, m_open, m_hold, m_cost, m_part, m_feature, m_minute,
                      m_scopes, m_tok)
               AS m(company_id, period_id, user_id, cost_grant_id, open, hold, cost, part, feature, rate_minute,
                    rate_scopes, tok)
    ), tokens AS (
        -- The token windows' deltas, per window row (period_id NULL for a feature's rows, which are
        -- not the period's), of the calls of its latest minute in the batch.
        SELECT t.company_id, t.period_id, t.owner, t.feature, t.minute, sum(t.tok)::bigint AS tok
          FROM (SELECT m.company_id, CASE WHEN o.feature = '' THEN m.period_id END AS period_id, o.owner, o.feature,
                       m.rate_minute AS minute, m.tok,
                       max(m.rate_minute) OVER (PARTITION BY m.company_id, CASE WHEN o.feature = '' THEN m.period_id END,
                                                             o.owner, o.feature) AS latest
                  FROM settled m
                 CROSS JOIN LATERAL (VALUES (1, '00000000-0000-0000-0000-000000000000'::uuid, ''), (2, m.user_id, ''),
                                            (8, '00000000-0000-0000-0000-000000000000'::uuid, m.feature),
                                            (16, m.user_id, m.feature)) AS o(bit, owner, feature)
                 WHERE m.tok IS NOT NULL AND (m.rate_scopes & o.bit) <> 0) t
         WHERE t.minute = t.latest
         GROUP BY t.company_id, t.period_id, t.owner, t.feature, t.minute
    ), moved AS (
        SELECT m.company_id, m.period_id, m.user_id, m.cost_grant_id, sum(coalesce(m.hold, 0))::bigint AS hold,
               sum(coalesce(m.cost, 0))::bigint AS cost,
               -- The company's share: its part of the hold, and of the cost at most that part.
               sum(coalesce(m.hold, 0) - coalesce(m.part, 0))::bigint AS c_hold,
               sum(CASE WHEN m.part IS NULL THEN coalesce(m.cost, 0)
                        ELSE least(coalesce(m.cost, 0), coalesce(m.hold, 0) - m.part) END)::bigint AS c_cost
          FROM settled m
         WHERE m.open AND (m.hold IS NOT NULL OR m.cost IS NOT NULL)
         GROUP BY m.company_id, m.period_id, m.user_id, m.cost_grant_id
    ), companies AS (
        -- One update of each row: its cost and its window's tokens.
        UPDATE company_usage cu
           SET cost_held = cu.cost_held - coalesce(c.hold, 0), cost_used = cu.cost_used + coalesce(c.cost, 0),
               rate_tokens = cu.rate_tokens + CASE WHEN cu.rate_minute = c.minute THEN c.tok ELSE 0 END
          FROM (SELECT coalesce(a.company_id, b.company_id) AS company_id, coalesce(a.period_id, b.period_id) AS period_id,
                       a.hold, a.cost, b.minute, b.tok
                  FROM (SELECT m.company_id, m.period_id, sum(m.c_hold)::bigint AS hold, sum(m.c_cost)::bigint AS cost
                          FROM moved m GROUP BY m.company_id, m.period_id) a
                  FULL JOIN (SELECT t.* FROM tokens t
                              WHERE t.owner = '00000000-0000-0000-0000-000000000000' AND t.feature = '') b
                    ON b.company_id = a.company_id AND b.period_id = a.period_id) c
         WHERE cu.company_id = c.company_id AND cu.period_id = c.period_id
    ), users AS (
        UPDATE user_usage uu
           SET cost_held = uu.cost_held - coalesce(m.hold, 0), cost_used = uu.cost_used + coalesce(m.cost, 0),
               rate_tokens = uu.rate_tokens + CASE WHEN uu.rate_minute = m.minute THEN m.tok ELSE 0 END
          FROM (SELECT coalesce(a.company_id, b.company_id) AS company_id, coalesce(a.period_id, b.period_id) AS period_id,
                       coalesce(a.user_id, b.owner) AS user_id, a.hold, a.cost, b.minute, b.tok
                  FROM (SELECT m.company_id, m.period_id, m.user_id, sum(m.hold)::bigint AS hold, sum(m.cost)::bigint AS cost
                          FROM moved m GROUP BY m.company_id, m.period_id, m.user_id) a
                  FULL JOIN (SELECT t.* FROM tokens t
                              WHERE t.owner <> '00000000-0000-0000-0000-000000000000' AND t.feature = '') b
                    ON b.company_id = a.company_id AND b.period_id = a.period_id AND b.owner = a.user_id) m
         WHERE uu.company_id = m.company_id AND uu.period_id = m.period_id AND uu.user_id = m.user_id
    ), windows AS (
        UPDATE rate_windows w SET tokens = w.tokens + t.tok
          FROM tokens t
         WHERE t.feature <> '' AND w.company_id = t.company_id AND w.user_id = t.owner AND w.feature_id = t.feature
           AND w.minute = t.minute
    ), grants AS (
        UPDATE topup_grants g SET cost_held = g.cost_held - m.hold, cost_used = g.cost_used + m.cost
          FROM (SELECT m.company_id, m.cost_grant_id, sum(m.hold - m.c_hold)::bigint AS hold,
                       sum(m.cost - m.c_cost)::bigint AS cost
                  FROM moved m WHERE m.cost_grant_id IS NOT NULL GROUP BY m.company_id, m.cost_grant_id) m
         WHERE g.company_id = m.company_id AND g.id = m.cost_grant_id
    )
    SELECT count(*) INTO v_n FROM settled;
END;
$$;
