-- Gives back to the top-up grants that paid a refunded call (SPEC §12: "refunds give back to the
-- grant they came from"): p_units to p_units_grant; to p_cost_grant its open hold p_held or its
-- settled cost p_cost. Each is the grant's part of the call only (capgate_refund divides a split
-- call: ledger units_grant_part, cost_grant_part). A refunded or expired grant takes it back too
-- (nothing is drawn from it again, so its remainder stays gone). Called last, after the counters
-- (the grants are the last rows locked, as in admission).
CREATE FUNCTION capgate_grant_give_back(
    p_company uuid, p_units_grant bigint, p_units bigint, p_cost_grant bigint, p_held bigint, p_cost bigint
) RETURNS void
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_units_grant IS NOT NULL AND p_units > 0 THEN
        UPDATE topup_grants SET units_used = units_used - p_units WHERE company_id = p_company AND id = p_units_grant;
    END IF;
    IF p_cost_grant IS NOT NULL AND (p_held > 0 OR p_cost > 0) THEN
        UPDATE topup_grants SET cost_held = cost_held - p_held, cost_used = cost_used - p_cost
         WHERE company_id = p_company AND id = p_cost_grant;
    END IF;
END;
$$;
