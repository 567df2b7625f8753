-- One plan window kept in a period counter row (capgate_rate_take): the company's (p_user NULL:
-- company_usage) or the user's (user_usage) row of p_period, which the caller already holds
-- locked. Adds one call and p_tokens to the minute p_minute when both fit (p_rpm calls, p_tpm
-- tokens; NULL: no limit): a row on an earlier minute starts again from zero, or from what the
-- periods before took in p_minute when p_period started inside it (capgate_rate_carry). Answers
-- the refusing window ('<p_who>-rpm' before '<p_who>-tpm', NULL when it fits) and the counts:
-- with the call, or as they stand.
CREATE FUNCTION capgate_rate_counter(
    p_company uuid, p_period bigint, p_user uuid, p_started timestamptz, p_minute timestamptz, p_tokens bigint,
    p_rpm integer, p_tpm bigint, p_who text,
    OUT refused text, OUT calls bigint, OUT tokens bigint
)
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_minute timestamptz;
BEGIN
    IF p_user IS NULL THEN
        SELECT cu.rate_minute, cu.rate_calls, cu.rate_tokens INTO v_minute, calls, tokens
          FROM company_usage cu WHERE cu.company_id = p_company AND cu.period_id = p_period;
    ELSE
        SELECT uu.rate_minute, uu.rate_calls, uu.rate_tokens INTO v_minute, calls, tokens
          FROM user_usage uu WHERE uu.company_id = p_company AND uu.period_id = p_period AND uu.user_id = p_user;
    END IF;
    IF v_minute IS NULL OR v_minute < p_minute THEN
        SELECT c.calls, c.tokens INTO calls, tokens FROM capgate_rate_carry(p_company, p_user, p_started, p_minute) c;
        v_minute := p_minute;
    END IF;
    refused := capgate_rate_refusal(calls, tokens, p_tokens, p_rpm, p_tpm, p_who);
    IF refused IS NOT NULL THEN
        RETURN;
    END IF;
    calls := calls + 1;
    tokens := tokens + p_tokens;
    IF p_user IS NULL THEN
        UPDATE company_usage cu
           SET rate_minute = v_minute, rate_calls = capgate_rate_counter.calls, rate_tokens = capgate_rate_counter.tokens
         WHERE cu.company_id = p_company AND cu.period_id = p_period;
    ELSE
        UPDATE user_usage uu
           SET rate_minute = v_minute, rate_calls = capgate_rate_counter.calls, rate_tokens = capgate_rate_counter.tokens
         WHERE uu.company_id = p_company AND uu.period_id = p_period AND uu.user_id = p_user;
    END IF;
END;
$$;
