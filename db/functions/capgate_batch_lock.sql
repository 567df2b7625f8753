-- Step 2 of capgate_admit_batch: lock (or create at zero) every counter the batch's calls reach
-- (capgate_batch_read's cslot .. uds), each kind in key order, the kinds in the order every
-- admission takes them: company, user, company feature period, company feature day, user feature
-- period, user feature day. Each array holds its kind's rows by the calls' slot numbers.
-- Each user whose plan limits its calls in flight (SPEC §14) has its live slots counted in its
-- row (slots), read under the user's counter lock: every admission of the user holds it when it
-- adds a slot. p_ended: the ledger ids of calls that ended (capgate_admit_batch's).
CREATE FUNCTION capgate_batch_lock(
    p_calls capgate_batch_call[], p_ended bigint[],
    OUT c_rows capgate_batch_counter[], OUT u_rows capgate_batch_counter[], OUT fp_rows capgate_batch_counter[],
    OUT fd_rows capgate_batch_counter[], OUT up_rows capgate_batch_counter[], OUT ud_rows capgate_batch_counter[]
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    WITH slot AS (
        SELECT DISTINCT s.cslot AS slot, s.company AS c, s.period AS p FROM unnest(p_calls) s WHERE s.cslot IS NOT NULL
    ), locked AS (
        INSERT INTO company_usage AS cu (company_id, period_id, used)
        SELECT slot.c, slot.p, 0 FROM slot ORDER BY slot.c, slot.p
        ON CONFLICT (company_id, period_id) DO UPDATE SET used = cu.used
        RETURNING cu.company_id, cu.period_id, cu.used, cu.cost_used, cu.cost_held, cu.rate_minute, cu.rate_calls,
                  cu.rate_tokens
    )
    SELECT array_agg(ROW(l.company_id, l.period_id, NULL, NULL, NULL, l.used, l.cost_used, l.cost_held, l.rate_minute,
                         l.rate_calls, l.rate_tokens, NULL, false)::capgate_batch_counter ORDER BY slot.slot)
      INTO c_rows
      FROM slot JOIN locked l ON l.company_id = slot.c AND l.period_id = slot.p;

    WITH slot AS (
        SELECT DISTINCT s.uslot AS slot, s.company AS c, s.period AS p, s.user_id AS u
          FROM unnest(p_calls) s WHERE s.uslot IS NOT NULL
    ), locked AS (
        INSERT INTO user_usage AS uu (company_id, period_id, user_id, used)
        SELECT slot.c, slot.p, slot.u, 0 FROM slot ORDER BY slot.c, slot.p, slot.u
        ON CONFLICT (company_id, period_id, user_id) DO UPDATE SET used = uu.used
        RETURNING uu.company_id, uu.period_id, uu.user_id, uu.used, uu.cost_used, uu.cost_held, uu.rate_minute,
                  uu.rate_calls, uu.rate_tokens
    )
    SELECT array_agg(ROW(l.company_id, l.period_id, l.user_id, NULL, NULL, l.used, l.cost_used, l.cost_held,
                         l.rate_minute, l.rate_calls, l.rate_tokens, NULL, false)::capgate_batch_counter ORDER BY slot.slot)
      INTO u_rows
      FROM slot JOIN locked l ON l.company_id = slot.c AND l.period_id = slot.p AND l.user_id = slot.u;

    IF EXISTS (SELECT 1 FROM unnest(p_calls) s WHERE s.uconc IS NOT NULL) THEN
        -- The rows of p_ended are calls that ended: not live.
        SELECT array_agg(ROW(r.company_id, r.period_id, r.user_id, NULL, NULL, r.used, r.cost_used, r.cost_held,
                             r.rate_minute, r.rate_calls, r.rate_tokens,
                             CASE WHEN x.conc THEN (SELECT count(*) FROM rate_calls rc
                                                     WHERE rc.company_id = x.c AND rc.user_id = x.u AND (rc.scopes & 4) <> 0
                                                       AND rc.lease_until > x.at AND rc.ledger_id <> ALL (p_ended))
                                  END, false)::capgate_batch_counter ORDER BY r.ordinality)
          INTO u_rows
          FROM unnest(u_rows) WITH ORDINALITY AS r
          LEFT JOIN (SELECT s.uslot AS slot, s.company AS c, s.user_id AS u, bool_or(s.uconc IS NOT NULL) AS conc,
                            min(s.at) AS at
                       FROM unnest(p_calls) s
                      WHERE s.uslot IS NOT NULL AND s.units > 0
                      GROUP BY s.uslot, s.company, s.user_id) x ON x.slot = r.ordinality;
    END IF;

    IF EXISTS (SELECT 1 FROM unnest(p_calls) s WHERE s.fps IS NOT NULL) THEN
        fp_rows := capgate_batch_lock_feature(p_calls, 'period', false);
        fd_rows := capgate_batch_lock_feature(p_calls, 'day', false);
        up_rows := capgate_batch_lock_feature(p_calls, 'period', true);
        ud_rows := capgate_batch_lock_feature(p_calls, 'day', true);
    END IF;
END;
$$;
