-- Ends calls in their rate windows (SPEC §14), once each call's answer is done (or its client
-- gone): a token window's count trades the call's hold for its real count (p_tokens; -1: not
-- known, the hold stays), in the minute the call was counted in (a minute already over is left
-- as it is), and the call's concurrency slot is freed. Idempotent: the ledger row keeps the
-- count it now has in the windows and loses its slot flag, so a second end changes nothing.
--
-- Lock order: the ledger rows, then the window rows in key order (company_id, user_id,
-- feature_id: the order capgate_rate_take and the batch's step 2 take them), then the slots. No
-- period counter is taken: an end waits for no admission but one holding the same windows.
-- Committed without waiting for the WAL flush: an end lost in a crash leaves the hold in a minute
-- that is over by the time the gateway is back, and the slot to its lease.
CREATE FUNCTION capgate_rate_end(p_company uuid[], p_ledger bigint[], p_tokens bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_nil constant uuid := '00000000-0000-0000-0000-000000000000';
    v_company uuid[];
    v_owner uuid[];
    v_feature text[];
    v_minute timestamptz[];
    v_delta bigint[];
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH ended AS (
        SELECT l.company_id, l.id, l.user_id, coalesce(l.feature, '') AS feature, l.rate_minute, l.rate_scopes,
               CASE WHEN s.tokens >= 0 THEN s.tokens - l.rate_tokens ELSE 0 END AS delta
          FROM unnest(p_company, p_ledger, p_tokens) AS s(c, id, tokens)
          JOIN usage_ledger l ON l.company_id = s.c AND l.id = s.id
         WHERE l.rate_scopes IS NOT NULL AND l.outcome = 'charged'
         ORDER BY l.company_id, l.id
           FOR UPDATE OF l
    ), ledger AS (
        UPDATE usage_ledger l SET rate_tokens = l.rate_tokens + e.delta, rate_scopes = l.rate_scopes & ~4::smallint
          FROM ended e
         WHERE l.company_id = e.company_id AND l.id = e.id
    )
    SELECT array_agg(m.company_id ORDER BY m.company_id, m.owner, m.feature), array_agg(m.owner ORDER BY m.company_id, m.owner, m.feature),
           array_agg(m.feature ORDER BY m.company_id, m.owner, m.feature), array_agg(m.minute ORDER BY m.company_id, m.owner, m.feature),
           array_agg(m.delta ORDER BY m.company_id, m.owner, m.feature)
      INTO v_company, v_owner, v_feature, v_minute, v_delta
      FROM (SELECT e.company_id, o.owner, o.feature, e.rate_minute AS minute, sum(e.delta)::bigint AS delta
              FROM ended e
             CROSS JOIN LATERAL (VALUES (1, v_nil, ''), (2, e.user_id, ''), (8, v_nil, e.feature), (16, e.user_id, e.feature))
                   AS o(bit, owner, feature)
             WHERE (e.rate_scopes & o.bit) <> 0 AND e.delta <> 0
             GROUP BY e.company_id, o.owner, o.feature, e.rate_minute) m;
    -- One row at a time, in key order.
    FOR i IN 1..coalesce(cardinality(v_company), 0) LOOP
        UPDATE rate_windows w SET tokens = w.tokens + v_delta[i]
         WHERE w.company_id = v_company[i] AND w.user_id = v_owner[i] AND w.feature_id = v_feature[i] AND w.minute = v_minute[i];
    END LOOP;
    DELETE FROM call_slots cs USING unnest(p_company, p_ledger) AS s(c, id) WHERE cs.company_id = s.c AND cs.ledger_id = s.id;
END;
$$;
