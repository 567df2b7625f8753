-- The counts a period that started inside p_minute carries over from the periods it follows
-- (SPEC §14): what the company's (p_user NULL) or the user's plan window took in p_minute in the
-- counter rows of the company's periods overlapping [p_minute, p_started). Read when a counter
-- row is first counted in the minute its period started in (the admission functions), so a new
-- period, a plan change included, opens no second window in one minute; (0, 0) when the period
-- started before p_minute. Read without their locks: a call counted in the old period after this
-- read (a gateway whose clock is behind) is not seen.
CREATE FUNCTION capgate_rate_carry(p_company uuid, p_user uuid, p_started timestamptz, p_minute timestamptz,
                                   OUT calls bigint, OUT tokens bigint)
LANGUAGE plpgsql STABLE
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    calls := 0;
    tokens := 0;
    IF p_started <= p_minute THEN
        RETURN;
    END IF;
    IF p_user IS NULL THEN
        SELECT coalesce(sum(cu.rate_calls), 0), coalesce(sum(cu.rate_tokens), 0) INTO calls, tokens
          FROM plan_periods pp JOIN company_usage cu ON cu.company_id = pp.company_id AND cu.period_id = pp.id
         WHERE pp.company_id = p_company AND pp.started_at < p_started AND pp.ends_at > p_minute
           AND cu.rate_minute = p_minute;
    ELSE
        SELECT coalesce(sum(uu.rate_calls), 0), coalesce(sum(uu.rate_tokens), 0) INTO calls, tokens
          FROM plan_periods pp JOIN user_usage uu ON uu.company_id = pp.company_id AND uu.period_id = pp.id
         WHERE pp.company_id = p_company AND pp.started_at < p_started AND pp.ends_at > p_minute
           AND uu.user_id = p_user AND uu.rate_minute = p_minute;
    END IF;
END;
$$;
