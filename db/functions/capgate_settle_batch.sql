-- Records the provider's status and usage on charges that stand, many at once (the gateway
-- queues them and writes one batch while the previous is in flight), and settles their cost
-- (SPEC §11): a call whose hold is still open (cost_source NULL) gets its cost, from its usage
-- at the price in force at the call's time (capgate_cost; cost_source 'usage') or, when the
-- usage is not known (p_known false, or its price is gone from the book), its hold
-- (cost_source 'hold'); in the same transaction
-- the company's and the user's counters trade the hold (cost_held) for the cost (cost_used).
-- Usage arrays hold -1 for a count the answer did not give.
--
-- Lock order, as capgate_refund: the ledger rows (key order), the company counters (key order),
-- the user counters (each user is one company's, so two batches meet at the company counter
-- first), then the top-up grants that hold part of a call's cost (cost_grant_id, SPEC §12: the
-- grant, not the company counter, trades its part of the hold, cost_grant_part, for its part of
-- the cost). An admission locks counters but no existing ledger row, so it never waits for a
-- settlement that waits for it; the ledger rows come first so that the counters, which the
-- admissions of those companies wait for, are held only for the short last statement (with the
-- counters first, the batch's planning and cost computation ran under them). The
-- cost is divided as the hold was: the plan pays first, up to the part it held, the grant the rest
-- (a cost past the whole hold is the grant's); a part NULL (a row from before 0020) is the whole.
-- A batch in which no cost moves (no open hold, no priced model) locks no counter.
-- Committed without waiting for the WAL flush: a settlement lost in a crash leaves the hold open,
-- which is never less than the call may cost (`capgate unsettled` decides it). Its ledger
-- statements are planned for each batch (custom plans): a generic plan made while the ledger was
-- empty scanned the whole ledger per batch until the first ANALYZE (measured: 41.7 million rows
-- read in the benchmark's first minute), and with sequential scans disabled the generic plan of
-- the main statement still took 950 ms a batch (measured, session 23). The counters' side (steps
-- 2 and 3), which reads no ledger row, is capgate_settle_counters, planned once per connection.
--
-- Rate windows (SPEC §14): p_rate, per call, is the real count of tokens (input, cache writes
-- and reads, output) of a call counted in a token window, -1 when not known (the hold stays), -3
-- for a call in none. A call's hold in its windows (usage_ledger.rate_tokens, in the minute
-- rate_minute, in the rows rate_scopes names) is traded for its real count in the same
-- transaction: the plan's windows in the company's and the user's counter rows (with the cost,
-- one update of each row), a feature's in its rate_windows rows; a row already on a later minute
-- is left as it is, and of a batch's calls of one row only those of its latest minute count. The
-- ledger row then holds the real count (what a refund gives back). The company counter is locked
-- (after the ledger rows) for these calls too, so a settlement meets an admission of the same
-- company there, before any window row. (A call's concurrency slot is freed apart, by
-- capgate_rate_end.)
--
-- The ledger is partitioned by month of created_at (0026): the batch's ids are found by an index
-- probe of each month's primary key; the update of step 1 then gives each row's time, as read under
-- its lock, so it touches the row's month only.
--
-- Returns the settled calls that cost more than their hold (the provider billed past the bound).
CREATE FUNCTION capgate_settle_batch(
    p_company uuid[], p_ledger bigint[], p_upstream_status integer[], p_input_tokens bigint[], p_output_tokens bigint[],
    p_cache_write_5m bigint[], p_cache_write_1h bigint[], p_cache_read bigint[], p_known boolean[], p_rate bigint[]
) RETURNS TABLE (company_id uuid, ledger_id bigint, hold bigint, cost bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql); and nested
-- loops only, the batch's arrays driving a probe of each row by its key. With hash joins allowed,
-- statistics from when the ledger was smaller made the batch's calls the probe side of a hash of
-- the whole ledger (a full index scan of every charged row), for each batch until the next
-- ANALYZE: 9.5 ms for 49 calls against 13,500 rows, 0.05 ms with nested loops (measured in
-- session 24, the check of whether any cost moves).
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_priced boolean := EXISTS (SELECT 1 FROM prices);  -- an empty book prices nothing
    v_models text[];      -- the batch's models with an open hold, each priced once (below)
    v_prices prices[];
    v_exact boolean[];
    -- the settled calls (step 1), for steps 2 and 3
    m_company uuid[]; m_id bigint[]; m_period bigint[]; m_user uuid[]; m_grant bigint[]; m_open boolean[];
    m_hold bigint[]; m_cost bigint[]; m_part bigint[]; m_feature text[]; m_minute timestamptz[]; m_scopes smallint[];
    m_tok bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Each model is priced once, at its latest call of the batch, as capgate_admit_batch's step 1
    -- prices its calls: a row in force since its earliest call is every call's price; otherwise
    -- its calls are looked up one by one. (A lookup per call was half the settlement's execution,
    -- 1.1 ms of a batch of 49 calls of one model, measured in session 24.)
    IF v_priced THEN
        SELECT array_agg(d.model), array_agg(pr.q), array_agg(pr.q IS NULL OR (pr.q).effective_from <= d.lo)
          INTO v_models, v_prices, v_exact
          FROM (SELECT l.model, min(l.created_at) AS lo, max(l.created_at) AS hi
                  FROM unnest(p_company, p_ledger) AS s(c, id)
                  JOIN usage_ledger l ON l.company_id = s.c AND l.id = s.id
                 WHERE l.model IS NOT NULL AND l.cost_source IS NULL AND l.units > 0
                 GROUP BY l.model) d
          LEFT JOIN LATERAL (SELECT q FROM capgate_price(d.model, d.hi) q) pr ON true;
    END IF;
    -- Whether any cost or window moves (read only; the rows that move are then locked): a batch
    -- in which none does (no hold, no priced model, no token window) writes the status and token
    -- counts only, one statement, no counter locked (a caps-only gateway's settlement).
    IF NOT EXISTS (
        SELECT 1
          FROM unnest(p_company, p_ledger, p_rate) AS s(c, id, rate)
          JOIN usage_ledger l ON l.company_id = s.c AND l.id = s.id
         WHERE l.outcome = 'charged' AND l.units > 0
           AND ((l.cost_source IS NULL
                 AND (l.hold_micros IS NOT NULL
                      OR (v_priced AND EXISTS (SELECT 1 FROM capgate_price(l.model, l.created_at)))))
                OR (s.rate >= 0 AND (l.rate_scopes & 27) <> 0 AND l.rate_tokens <> s.rate))) THEN
        UPDATE usage_ledger l
           SET upstream_status = s.status, input_tokens = nullif(s.input, -1), output_tokens = nullif(s.output, -1),
               cache_write_5m_tokens = nullif(s.w5, -1), cache_write_1h_tokens = nullif(s.w1, -1),
               cache_read_tokens = nullif(s.rd, -1), settled_at = clock_timestamp()
          FROM unnest(p_company, p_ledger, p_upstream_status, p_input_tokens, p_output_tokens, p_cache_write_5m,
                      p_cache_write_1h, p_cache_read) AS s(c, id, status, input, output, w5, w1, rd)
         WHERE l.company_id = s.c AND l.id = s.id AND l.outcome = 'charged';
        RETURN;
    END IF;
    -- 1. The ledger rows, locked in key order, settled: the cost of each open hold computed and
    --    written before any counter is locked, so the counters stay locked only for step 3's
    --    short update (admissions of the same companies wait for them).
    WITH settled AS (
        UPDATE usage_ledger l
           SET upstream_status = o.status, input_tokens = nullif(o.input, -1), output_tokens = nullif(o.output, -1),
               cache_write_5m_tokens = nullif(o.w5, -1), cache_write_1h_tokens = nullif(o.w1, -1),
               cache_read_tokens = nullif(o.rd, -1), settled_at = clock_timestamp(),
               cost_micros = CASE WHEN o.open THEN o.cost ELSE l.cost_micros END,
               cost_source = CASE WHEN NOT o.open OR o.cost IS NULL THEN l.cost_source
                                  WHEN o.usage_cost IS NOT NULL THEN 'usage' ELSE 'hold' END,
               rate_tokens = CASE WHEN o.tok IS NOT NULL THEN o.rate ELSE l.rate_tokens END
          FROM (
            SELECT x.*, CASE WHEN x.open THEN coalesce(x.usage_cost, x.hold) END AS cost
              FROM (
                SELECT l2.company_id, l2.id, l2.created_at AS row_at, l2.hold_micros AS hold, s.status, s.input, s.output,
                       s.w5, s.w1, s.rd,
                       (l2.cost_source IS NULL AND l2.units > 0) AS open, s.rate,
                       CASE WHEN s.rate >= 0 AND l2.units > 0 AND (l2.rate_scopes & 27) <> 0 AND l2.rate_tokens <> s.rate
                            THEN s.rate - l2.rate_tokens END AS tok,
                       CASE WHEN l2.cost_source IS NULL AND l2.units > 0 AND s.known
                            THEN (SELECT capgate_cost(pr.q, greatest(s.input, 0), greatest(s.w5, 0), greatest(s.w1, 0),
                                                      greatest(s.rd, 0), greatest(s.output, 0))
                                    FROM (SELECT CASE WHEN v_exact[mk.k] THEN v_prices[mk.k]
                                                      ELSE (SELECT q FROM capgate_price(l2.model, l2.created_at) q) END AS q
                                            FROM (SELECT array_position(v_models, l2.model) AS k) mk
                                           WHERE mk.k IS NOT NULL) pr
                                   WHERE (pr.q).model IS NOT NULL) END AS usage_cost
                  FROM unnest(p_company, p_ledger, p_upstream_status, p_input_tokens, p_output_tokens, p_cache_write_5m,
                              p_cache_write_1h, p_cache_read, p_known, p_rate)
                       AS s(c, id, status, input, output, w5, w1, rd, known, rate)
                  JOIN usage_ledger l2 ON l2.company_id = s.c AND l2.id = s.id
                 WHERE l2.outcome = 'charged'
                 ORDER BY l2.company_id, l2.id
                   FOR UPDATE OF l2
              ) x
          ) o
         WHERE l.company_id = o.company_id AND l.id = o.id AND l.created_at = o.row_at
        RETURNING l.company_id, l.id, l.period_id, l.user_id, l.cost_grant_id, o.open, o.hold, o.cost,
                  CASE WHEN l.cost_grant_id IS NOT NULL THEN coalesce(l.cost_grant_part, o.hold) END AS part,
                  coalesce(l.feature, '') AS feature, l.rate_minute, l.rate_scopes, o.tok
    )
    SELECT array_agg(m.company_id), array_agg(m.id), array_agg(m.period_id), array_agg(m.user_id),
           array_agg(m.cost_grant_id), array_agg(m.open), array_agg(m.hold), array_agg(m.cost), array_agg(m.part),
           array_agg(m.feature), array_agg(m.rate_minute), array_agg(m.rate_scopes), array_agg(m.tok)
      INTO m_company, m_id, m_period, m_user, m_grant, m_open, m_hold, m_cost, m_part, m_feature, m_minute, m_scopes,
           m_tok
      FROM settled m;
    -- 2. and 3. The counters, grants and feature windows trade the holds for what was settled
    --    (capgate_settle_counters: planned once per connection, as it reads no ledger row).
    IF m_id IS NOT NULL THEN
        PERFORM capgate_settle_counters(m_company, m_period, m_user, m_grant, m_open, m_hold, m_cost, m_part, m_feature,
                                        m_minute, m_scopes, m_tok);
    END IF;
    RETURN QUERY
    SELECT s.c, s.id, s.hold, s.cost
      FROM unnest(m_company, m_id, m_open, m_hold, m_cost) AS s(c, id, open, hold, cost)
     WHERE s.open AND s.hold IS NOT NULL AND s.cost > s.hold;
END;
$$;
