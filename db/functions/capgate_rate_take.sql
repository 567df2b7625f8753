-- Counts one metered call in its rate windows (SPEC §14), or refuses it and changes nothing:
-- the company's window (p_crpm calls, p_ctpm tokens a minute), then the user's (p_urpm,
-- p_utpm), then the user's calls in flight (p_conc). NULL limits are not checked; an owner with
-- no limit set has no row touched. p_tokens: what the call holds in the token windows (its
-- prompt bound plus max_tokens, capgate_rate_tokens; 0 when it has none and no token window
-- applies).
--
-- The window is the UTC minute of p_at. A row still on an earlier minute starts again at zero
-- in the same conditional update; a row already on a later one (another gateway's clock ahead)
-- takes the call into that minute. Each update takes its row's lock, held to commit: the caller
-- holds the company's period counter first (capgate_charge, capgate_admit_batch), so every
-- writer of a company's windows meets there before them, and two calls of one user are decided
-- one after the other (the in-flight count included: the caller adds the call's slot, in
-- call_slots, before its transaction ends, and the slots past their lease are removed here).
CREATE FUNCTION capgate_rate_take(
    p_company uuid, p_user uuid, p_at timestamptz, p_tokens bigint, p_crpm integer, p_ctpm bigint,
    p_urpm integer, p_utpm bigint, p_conc integer
) RETURNS capgate_rate
LANGUAGE plpgsql AS $$
DECLARE
    r capgate_rate;
    v_nil constant uuid := '00000000-0000-0000-0000-000000000000';
    v_calls bigint;
    v_tokens bigint;
BEGIN
    r.minute := date_trunc('minute', p_at, 'UTC');
    r.scopes := 0;
    IF p_crpm IS NOT NULL OR p_ctpm IS NOT NULL THEN
        SELECT * INTO r.refused, r.c_calls, r.c_tokens
          FROM capgate_rate_count(p_company, v_nil, r.minute, p_tokens, p_crpm, p_ctpm, 'company');
        IF r.refused IS NOT NULL THEN
            r.scopes := 0;
            RETURN r;
        END IF;
        r.scopes := 1;
    END IF;
    IF p_urpm IS NOT NULL OR p_utpm IS NOT NULL OR p_conc IS NOT NULL THEN
        SELECT * INTO r.refused, r.u_calls, r.u_tokens
          FROM capgate_rate_count(p_company, p_user, r.minute, p_tokens, p_urpm, p_utpm, 'user');
        IF r.refused IS NULL AND p_conc IS NOT NULL THEN
            DELETE FROM call_slots WHERE company_id = p_company AND user_id = p_user AND lease_until <= p_at;
            SELECT count(*) INTO r.u_slots FROM call_slots WHERE company_id = p_company AND user_id = p_user;
            IF r.u_slots >= p_conc THEN
                r.refused := 'user-concurrency';
                UPDATE rate_windows SET calls = calls - 1, tokens = tokens - p_tokens
                 WHERE company_id = p_company AND user_id = p_user
                RETURNING calls, tokens INTO r.u_calls, r.u_tokens;
            ELSE
                r.u_slots := r.u_slots + 1;
            END IF;
        END IF;
        IF r.refused IS NOT NULL THEN
            IF r.scopes = 1 THEN
                UPDATE rate_windows SET calls = calls - 1, tokens = tokens - p_tokens
                 WHERE company_id = p_company AND user_id = v_nil
                RETURNING calls, tokens INTO r.c_calls, r.c_tokens;
            END IF;
            r.scopes := 0;
            RETURN r;
        END IF;
        r.scopes := r.scopes | 2;
    END IF;
    RETURN r;
END;
$$;
