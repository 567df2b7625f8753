-- The settlement's last step (capgate_settle_batch): the calls of the batch that end in their
-- rate windows (p_rate >= -1; -3: in no window) are ended by capgate_rate_end with their counts.
-- A batch without any costs one scan of the array.
CREATE FUNCTION capgate_settle_windows(p_company uuid[], p_ledger bigint[], p_rate bigint[]) RETURNS void
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_company uuid[];
    v_ledger bigint[];
    v_tokens bigint[];
BEGIN
    IF p_rate IS NULL OR NOT EXISTS (SELECT 1 FROM unnest(p_rate) t WHERE t >= -1) THEN
        RETURN;
    END IF;
    SELECT array_agg(s.c), array_agg(s.id), array_agg(s.tokens) INTO v_company, v_ledger, v_tokens
      FROM unnest(p_company, p_ledger, p_rate) AS s(c, id, tokens) WHERE s.tokens >= -1;
    PERFORM capgate_rate_end(v_company, v_ledger, v_tokens);
END;
$$;
