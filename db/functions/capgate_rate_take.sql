-- Counts one metered call in its rate windows (SPEC §14), or refuses it and changes nothing:
-- the plan's company window (p_crpm calls, p_ctpm tokens a minute, kept in the company's counter
-- row of p_period), then for a call of p_feature whose entitlement sets some, the company's
-- window of that feature (p_fcrpm, p_fctpm, a rate_windows row); the user's (p_urpm, p_utpm, in
-- the user's counter row) and the user's calls in flight (p_conc); the user's window of the
-- feature (p_furpm, p_futpm) and the user's calls of that feature in flight (p_fconc). NULL
-- limits are not checked; an owner with no limit set has no row touched. p_tokens: what the call
-- holds in the token windows (its prompt bound plus max_tokens, capgate_rate_tokens; 0 when it
-- has none and no token window applies). p_started: the period's start (capgate_rate_carry).
--
-- The window is the UTC minute of p_at. A row still on an earlier minute starts again at zero
-- in the same update; a feature row already on a later one (another gateway's clock ahead) takes
-- the call into that minute. The caller (capgate_charge) holds the company's and the user's
-- counter rows locked; the feature rows are locked here in key order (the company's before the
-- user's, as the batch's step 2b takes them), so two calls of one user are decided one after the
-- other (the in-flight counts included: the caller adds the call's slot, in rate_calls, before
-- its transaction ends; a slot past its lease does not count, nor one of p_ended: the calls that
-- ended on the caller's gateway whose rows capgate_rate_end may not have deleted yet).
-- A refusal takes back what this call added to the windows before it.
CREATE FUNCTION capgate_rate_take(
    p_company uuid, p_period bigint, p_started timestamptz, p_user uuid, p_at timestamptz, p_tokens bigint, p_crpm integer, p_ctpm bigint,
    p_urpm integer, p_utpm bigint, p_conc integer, p_feature text DEFAULT NULL, p_fcrpm integer DEFAULT NULL,
    p_fctpm bigint DEFAULT NULL, p_furpm integer DEFAULT NULL, p_futpm bigint DEFAULT NULL, p_fconc integer DEFAULT NULL,
    p_ended bigint[] DEFAULT '{}'
) RETURNS capgate_rate
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r capgate_rate;
    v_nil constant uuid := '00000000-0000-0000-0000-000000000000';
BEGIN
    r.minute := date_trunc('minute', p_at, 'UTC');
    r.scopes := 0;
    -- The company's windows before the user's, the plan's before the feature's.
    IF p_crpm IS NOT NULL OR p_ctpm IS NOT NULL THEN
        SELECT * INTO r.refused, r.c_calls, r.c_tokens
          FROM capgate_rate_counter(p_company, p_period, NULL, p_started, r.minute, p_tokens, p_crpm, p_ctpm, 'company');
        r.scopes := CASE WHEN r.refused IS NULL THEN 1 ELSE 0 END;
    END IF;
    IF r.refused IS NULL AND p_feature IS NOT NULL AND (p_fcrpm IS NOT NULL OR p_fctpm IS NOT NULL) THEN
        SELECT * INTO r.refused, r.fc_calls, r.fc_tokens
          FROM capgate_rate_count(p_company, v_nil, p_feature, r.minute, p_tokens, p_fcrpm, p_fctpm, 'feature.company');
        r.scopes := r.scopes | CASE WHEN r.refused IS NULL THEN 8 ELSE 0 END;
    END IF;
    IF r.refused IS NULL AND (p_urpm IS NOT NULL OR p_utpm IS NOT NULL OR p_conc IS NOT NULL) THEN
        SELECT * INTO r.refused, r.u_calls, r.u_tokens
          FROM capgate_rate_counter(p_company, p_period, p_user, p_started, r.minute, p_tokens, p_urpm, p_utpm, 'user');
        IF r.refused IS NULL THEN
            r.scopes := r.scopes | 2;
            IF p_conc IS NOT NULL THEN
                SELECT count(*) INTO r.u_slots FROM rate_calls
                 WHERE company_id = p_company AND user_id = p_user AND (scopes & 4) <> 0 AND lease_until > p_at
                   AND ledger_id <> ALL (p_ended);
                r.refused := CASE WHEN r.u_slots >= p_conc THEN 'user-concurrency' END;
                r.u_slots := r.u_slots + CASE WHEN r.refused IS NULL THEN 1 ELSE 0 END;
            END IF;
        END IF;
    END IF;
    IF r.refused IS NULL AND p_feature IS NOT NULL AND (p_furpm IS NOT NULL OR p_futpm IS NOT NULL OR p_fconc IS NOT NULL) THEN
        SELECT * INTO r.refused, r.fu_calls, r.fu_tokens
          FROM capgate_rate_count(p_company, p_user, p_feature, r.minute, p_tokens, p_furpm, p_futpm, 'feature.user');
        IF r.refused IS NULL THEN
            r.scopes := r.scopes | 16;
            IF p_fconc IS NOT NULL THEN
                SELECT count(*) INTO r.fu_slots FROM rate_calls
                 WHERE company_id = p_company AND user_id = p_user AND (scopes & 4) <> 0 AND lease_until > p_at
                   AND feature_id = p_feature AND ledger_id <> ALL (p_ended);
                r.refused := CASE WHEN r.fu_slots >= p_fconc THEN 'feature.user-concurrency' END;
                r.fu_slots := r.fu_slots + CASE WHEN r.refused IS NULL THEN 1 ELSE 0 END;
            END IF;
        END IF;
    END IF;
    IF r.refused IS NOT NULL THEN
        -- The user's slot count stands without this call (it takes no slot).
        IF r.u_slots IS NOT NULL AND r.refused <> 'user-concurrency' THEN
            r.u_slots := r.u_slots - 1;
        END IF;
        -- Newest first, each row as it now stands for the refusal's RateLimit fields.
        IF (r.scopes & 16) <> 0 THEN
            UPDATE rate_windows SET calls = calls - 1, tokens = tokens - p_tokens
             WHERE company_id = p_company AND user_id = p_user AND feature_id = p_feature
            RETURNING calls, tokens INTO r.fu_calls, r.fu_tokens;
        END IF;
        IF (r.scopes & 8) <> 0 THEN
            UPDATE rate_windows SET calls = calls - 1, tokens = tokens - p_tokens
             WHERE company_id = p_company AND user_id = v_nil AND feature_id = p_feature
            RETURNING calls, tokens INTO r.fc_calls, r.fc_tokens;
        END IF;
        IF (r.scopes & 2) <> 0 THEN
            UPDATE user_usage SET rate_calls = rate_calls - 1, rate_tokens = rate_tokens - p_tokens
             WHERE company_id = p_company AND period_id = p_period AND user_id = p_user
            RETURNING rate_calls, rate_tokens INTO r.u_calls, r.u_tokens;
        END IF;
        IF (r.scopes & 1) <> 0 THEN
            UPDATE company_usage SET rate_calls = rate_calls - 1, rate_tokens = rate_tokens - p_tokens
             WHERE company_id = p_company AND period_id = p_period
            RETURNING rate_calls, rate_tokens INTO r.c_calls, r.c_tokens;
        END IF;
        r.scopes := 0;
    END IF;
    RETURN r;
END;
$$;
