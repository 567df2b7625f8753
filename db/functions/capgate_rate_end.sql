-- Ends calls in their rate windows (SPEC §14), once each call's answer is done (or its client
-- gone): a token window's count trades the call's hold for its real count (p_tokens; -1: not
-- known, the hold stays), in the minute the call was counted in (a minute already over is left
-- as it is), and the call's concurrency slot is freed. Idempotent: the ledger row keeps the
-- count it now has in the windows and loses its slot flag, so a second end changes nothing.
--
-- Lock order as the settlement's: the company counters, the ledger rows, then the windows (in
-- key order). Committed without waiting for the WAL flush: an end lost in a crash leaves the
-- hold in a minute that is over by the time the gateway is back, and the slot to its lease.
CREATE FUNCTION capgate_rate_end(p_company uuid[], p_ledger bigint[], p_tokens bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_nil constant uuid := '00000000-0000-0000-0000-000000000000';
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM company_usage cu
     WHERE (cu.company_id, cu.period_id) IN (
             SELECT l.company_id, l.period_id
               FROM unnest(p_company, p_ledger) AS s(c, id)
               JOIN usage_ledger l ON l.company_id = s.c AND l.id = s.id
              WHERE l.rate_scopes IS NOT NULL AND l.outcome = 'charged')
     ORDER BY cu.company_id, cu.period_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    WITH ended AS (
        SELECT l.company_id, l.id, l.user_id, l.rate_minute, l.rate_scopes,
               CASE WHEN s.tokens >= 0 THEN s.tokens - l.rate_tokens ELSE 0 END AS delta
          FROM unnest(p_company, p_ledger, p_tokens) AS s(c, id, tokens)
          JOIN usage_ledger l ON l.company_id = s.c AND l.id = s.id
         WHERE l.rate_scopes IS NOT NULL AND l.outcome = 'charged'
         ORDER BY l.company_id, l.id
           FOR UPDATE OF l
    ), ledger AS (
        UPDATE usage_ledger l SET rate_tokens = l.rate_tokens + e.delta, rate_scopes = l.rate_scopes & 3
          FROM ended e
         WHERE l.company_id = e.company_id AND l.id = e.id
    ), slots AS (
        DELETE FROM call_slots cs USING ended e
         WHERE (e.rate_scopes & 4) <> 0 AND cs.company_id = e.company_id AND cs.ledger_id = e.id
    ), moved AS (
        SELECT o.company_id, o.owner, o.minute, sum(o.delta)::bigint AS delta
          FROM (SELECT e.company_id, v_nil AS owner, e.rate_minute AS minute, e.delta FROM ended e
                 WHERE (e.rate_scopes & 1) <> 0 AND e.delta <> 0
                UNION ALL
                SELECT e.company_id, e.user_id, e.rate_minute, e.delta FROM ended e
                 WHERE (e.rate_scopes & 2) <> 0 AND e.delta <> 0) o
         GROUP BY o.company_id, o.owner, o.minute
    )
    UPDATE rate_windows w SET tokens = w.tokens + m.delta
      FROM (SELECT * FROM moved ORDER BY company_id, owner) m
     WHERE w.company_id = m.company_id AND w.user_id = m.owner AND w.minute = m.minute;
END;
$$;
