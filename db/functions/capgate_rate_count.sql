-- One owner's minute window (capgate_rate_take): adds one call and p_tokens to the row of
-- (p_company, p_owner, p_feature) when both fit (p_rpm calls, p_tpm tokens; NULL: no limit), creating the
-- row on the owner's first call and starting it again when its minute has passed. Answers the
-- refusing window ('<p_who>-rpm' before '<p_who>-tpm', NULL when it fits) and the counts: with
-- the call, or as they stand. The row stays locked to the end of the transaction either way.
CREATE FUNCTION capgate_rate_count(
    p_company uuid, p_owner uuid, p_feature text, p_minute timestamptz, p_tokens bigint, p_rpm integer, p_tpm bigint, p_who text,
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
    UPDATE rate_windows w
       SET minute = greatest(w.minute, p_minute),
           calls = CASE WHEN w.minute >= p_minute THEN w.calls ELSE 0 END + 1,
           tokens = CASE WHEN w.minute >= p_minute THEN w.tokens ELSE 0 END + p_tokens
     WHERE w.company_id = p_company AND w.user_id = p_owner AND w.feature_id = p_feature
       AND (p_rpm IS NULL OR CASE WHEN w.minute >= p_minute THEN w.calls ELSE 0 END + 1 <= p_rpm)
       AND (p_tpm IS NULL OR CASE WHEN w.minute >= p_minute THEN w.tokens ELSE 0 END + p_tokens <= p_tpm)
    RETURNING w.calls, w.tokens INTO calls, tokens;
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO rate_windows (company_id, user_id, feature_id, minute, calls, tokens)
    VALUES (p_company, p_owner, p_feature, p_minute, 0, 0)
        ON CONFLICT DO NOTHING;
    SELECT CASE WHEN w.minute >= p_minute THEN w.calls ELSE 0 END, CASE WHEN w.minute >= p_minute THEN w.tokens ELSE 0 END,
           greatest(w.minute, p_minute)
      INTO calls, tokens, v_minute
      FROM rate_windows w WHERE w.company_id = p_company AND w.user_id = p_owner AND w.feature_id = p_feature FOR UPDATE;
    refused := capgate_rate_refusal(calls, tokens, p_tokens, p_rpm, p_tpm, p_who);
    IF refused IS NOT NULL THEN
        RETURN;
    END IF;
    calls := calls + 1;
    tokens := tokens + p_tokens;
    UPDATE rate_windows w SET minute = v_minute, calls = capgate_rate_count.calls, tokens = capgate_rate_count.tokens
     WHERE w.company_id = p_company AND w.user_id = p_owner AND w.feature_id = p_feature;
END;
$$;
