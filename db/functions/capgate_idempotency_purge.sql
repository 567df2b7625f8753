-- Forgets keys older than their lifetime, at most p_limit rows per call (the purge job calls it
-- until it returns fewer).
CREATE FUNCTION capgate_idempotency_purge(p_at timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM idempotency_keys ik
     WHERE (ik.company_id, ik.user_id, ik.key) IN (
            SELECT o.company_id, o.user_id, o.key FROM idempotency_keys o
             WHERE o.created_at <= p_at - capgate_idempotency_lifetime()
             ORDER BY o.created_at LIMIT p_limit
               FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

