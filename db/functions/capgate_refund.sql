-- Gives back one attempt's charge: the counters it added (company, user, and the feature's
-- period and day counters it charged; its open hold or its settled cost) are decremented and the ledger row marked refunded, in
-- one transaction. Idempotent: a refund retried after a lost answer changes nothing.
--
-- Lock order: the attempt's Idempotency-Key row (marked failed, so a retry is a new attempt),
-- the ledger row, the company counter, the user counter, the feature counters, the top-up grants
-- that paid part of it (SPEC §12: units_grant_id, cost_grant_id; the parts they paid,
-- units_grant_part, cost_grant_part, never were on the company counter, so they are given back to
-- them instead: capgate_grant_give_back; the company gets back the rest), the call's rate_calls
-- row, the feature's rate windows (SPEC §14; grants before windows, as capgate_charge takes them).
-- The call's tokens leave the rate windows it was counted in (rate_scopes), if their minute is
-- still rate_minute: the plan's in the company and user counters, a feature's in its rate_windows
-- rows, as the ledger row has them (the hold, or the real count once settled). The call itself
-- leaves the call windows only when the provider never answered it (p_upstream_status NULL: no
-- connection, its share refused, an admission given back): a call the provider answered, with an
-- error, was seen by it and stays counted (SPEC §14), or an SDK retrying 429s and 529s would
-- send the provider as many calls a minute as it likes.
-- A settled cost is divided as capgate_settle_batch divided it: the company's share is at most its
-- part of the hold, the grant's the rest. A part NULL with its grant set (before 0020) is the whole.
-- A charge replayed under 0009's rules (ledger rows written before 0010) stands until every
-- attempt at it failed (usage_ledger_attempts).
-- The ledger is partitioned by month of created_at (0026): p_created_at, the row's created_at as
-- the caller read it (`capgate unsettled` has it), narrows the first look-up to the row's month
-- (a second either side, for a time that went through a client's clock type); NULL looks in every
-- month, an index probe each. The later look-ups give the row's exact time, found by the first.
CREATE FUNCTION capgate_refund(p_company uuid, p_ledger_id bigint, p_upstream_status integer,
                               p_request_id text DEFAULT NULL, p_created_at timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    l usage_ledger%ROWTYPE;
    v_period_start timestamptz;
    v_held bigint;
    v_cost bigint;
    v_g_units bigint;      -- the grant's part of the units, of the open hold, of the settled cost
    v_g_held bigint;
    v_g_cost bigint;
BEGIN
    IF p_created_at IS NULL THEN
        SELECT * INTO l FROM usage_ledger WHERE company_id = p_company AND id = p_ledger_id;
    ELSE
        SELECT * INTO l FROM usage_ledger
         WHERE company_id = p_company AND id = p_ledger_id
           AND created_at BETWEEN p_created_at - interval '1 second' AND p_created_at + interval '1 second';
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF l.idempotency_key IS NOT NULL THEN
        UPDATE idempotency_keys SET state = 'failed', updated_at = clock_timestamp()
         WHERE company_id = p_company AND user_id = l.user_id AND key = l.idempotency_key
           AND request_id = l.request_id AND state = 'in_flight';
    END IF;
    SELECT * INTO l FROM usage_ledger
     WHERE company_id = p_company AND id = p_ledger_id AND created_at = l.created_at FOR UPDATE;
    PERFORM 1 FROM company_usage WHERE company_id = p_company AND period_id = l.period_id FOR UPDATE;
    IF l.outcome <> 'charged' THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM usage_ledger_attempts WHERE company_id = p_company AND ledger_id = p_ledger_id) THEN
        INSERT INTO usage_ledger_attempts (company_id, ledger_id, request_id, failed)
        VALUES (p_company, p_ledger_id, coalesce(p_request_id, l.request_id), true)
        ON CONFLICT (company_id, ledger_id, request_id) DO UPDATE SET failed = true;
        IF EXISTS (SELECT 1 FROM usage_ledger_attempts
                    WHERE company_id = p_company AND ledger_id = p_ledger_id AND NOT failed)
           OR NOT EXISTS (SELECT 1 FROM usage_ledger_attempts
                           WHERE company_id = p_company AND ledger_id = p_ledger_id AND request_id = l.request_id) THEN
            RETURN false;  -- an attempt is still in flight, or has succeeded: the charge stands
        END IF;
    END IF;
    -- What the call holds or cost (SPEC §11): an open hold, or a settled cost, is given back too.
    v_held := CASE WHEN l.cost_source IS NULL THEN coalesce(l.hold_micros, 0) ELSE 0 END;
    v_cost := CASE WHEN l.cost_source IS NOT NULL THEN coalesce(l.cost_micros, 0) ELSE 0 END;
    v_g_units := CASE WHEN l.units_grant_id IS NULL THEN 0 ELSE coalesce(l.units_grant_part, l.units) END;
    v_g_held := CASE WHEN l.cost_grant_id IS NULL OR l.cost_source IS NOT NULL THEN 0
                     ELSE coalesce(l.cost_grant_part, v_held) END;
    v_g_cost := CASE WHEN l.cost_grant_id IS NULL THEN 0
                     ELSE v_cost - least(v_cost, coalesce(l.hold_micros, 0) - coalesce(l.cost_grant_part, l.hold_micros, 0)) END;
    IF l.units > 0 OR v_held > 0 OR v_cost > 0 THEN
        UPDATE company_usage
           SET used = used - (l.units - v_g_units),
               cost_held = cost_held - (v_held - v_g_held),
               cost_used = cost_used - (v_cost - v_g_cost),
               rate_calls = CASE WHEN (l.rate_scopes & 1) <> 0 AND rate_minute = l.rate_minute
                                      AND p_upstream_status IS NULL
                                 THEN greatest(rate_calls - 1, 0) ELSE rate_calls END,
               rate_tokens = CASE WHEN (l.rate_scopes & 1) <> 0 AND rate_minute = l.rate_minute
                                  THEN rate_tokens - coalesce(l.rate_tokens, 0) ELSE rate_tokens END
         WHERE company_id = p_company AND period_id = l.period_id;
        UPDATE user_usage
           SET used = used - l.units, cost_held = cost_held - v_held, cost_used = cost_used - v_cost,
               rate_calls = CASE WHEN (l.rate_scopes & 2) <> 0 AND rate_minute = l.rate_minute
                                      AND p_upstream_status IS NULL
                                 THEN greatest(rate_calls - 1, 0) ELSE rate_calls END,
               rate_tokens = CASE WHEN (l.rate_scopes & 2) <> 0 AND rate_minute = l.rate_minute
                                  THEN rate_tokens - coalesce(l.rate_tokens, 0) ELSE rate_tokens END
         WHERE company_id = p_company AND period_id = l.period_id AND user_id = l.user_id;
    END IF;
    IF l.units > 0 THEN
        IF l.feature IS NOT NULL AND l.feature_day IS NOT NULL THEN
            SELECT started_at INTO v_period_start FROM plan_periods WHERE company_id = p_company AND id = l.period_id;
            UPDATE company_feature_usage SET used = used - l.units
             WHERE company_id = p_company AND feature_id = l.feature AND span = 'period' AND starts_at = v_period_start;
            UPDATE company_feature_usage SET used = used - l.units
             WHERE company_id = p_company AND feature_id = l.feature AND span = 'day' AND starts_at = l.feature_day;
            UPDATE user_feature_usage SET used = used - l.units
             WHERE company_id = p_company AND user_id = l.user_id AND feature_id = l.feature AND span = 'period'
               AND starts_at = v_period_start;
            UPDATE user_feature_usage SET used = used - l.units
             WHERE company_id = p_company AND user_id = l.user_id AND feature_id = l.feature AND span = 'day'
               AND starts_at = l.feature_day;
        END IF;
    END IF;
    IF l.units_grant_id IS NOT NULL OR l.cost_grant_id IS NOT NULL THEN
        PERFORM capgate_grant_give_back(p_company, l.units_grant_id, v_g_units, l.cost_grant_id, v_g_held, v_g_cost);
    END IF;
    -- The rate windows (SPEC §14): the call leaves rate_calls (its concurrency slot freed: it
    -- ended at the provider, or never reached it), then its tokens, and the call unless the
    -- provider answered it, leave its feature's minute windows (if the minute is still the row's).
    IF l.rate_scopes IS NOT NULL THEN
        DELETE FROM rate_calls WHERE company_id = p_company AND ledger_id = p_ledger_id;
        UPDATE rate_windows w
           SET calls = CASE WHEN p_upstream_status IS NULL THEN greatest(w.calls - 1, 0) ELSE w.calls END,
               tokens = w.tokens - coalesce(l.rate_tokens, 0)
          FROM (VALUES (8, '00000000-0000-0000-0000-000000000000'::uuid), (16, l.user_id)) AS o(bit, owner)
         WHERE (l.rate_scopes & o.bit) <> 0 AND w.company_id = p_company AND w.user_id = o.owner
           AND w.feature_id = l.feature AND w.minute = l.rate_minute;
    END IF;
    UPDATE usage_ledger
       SET outcome = 'refunded', upstream_status = p_upstream_status, settled_at = clock_timestamp()
     WHERE company_id = p_company AND id = p_ledger_id AND created_at = l.created_at;
    RETURN true;
END;
$$;
