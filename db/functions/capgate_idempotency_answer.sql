-- The answer of an attempt that succeeded (2xx), kept for retries; p_body NULL: too large to
-- keep (a retry gets idempotency_not_kept). Only the attempt holding the key records it.
CREATE FUNCTION capgate_idempotency_answer(
    p_company uuid, p_user uuid, p_key text, p_request_id text, p_status integer, p_type text, p_body bytea
) RETURNS boolean
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    UPDATE idempotency_keys
       SET state = 'succeeded', response_status = p_status, response_type = p_type, response_body = p_body,
           response_kept = p_body IS NOT NULL, updated_at = clock_timestamp()
     WHERE company_id = p_company AND user_id = p_user AND key = p_key AND request_id = p_request_id
       AND state = 'in_flight';
    RETURN FOUND;
END;
$$;
