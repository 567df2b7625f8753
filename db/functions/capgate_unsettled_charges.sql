-- The unsettled charges created at or before p_before (outcome 'charged', settled_at NULL), of one
-- company or all (p_company NULL): what `capgate unsettled`, `/metrics` and `capgate verify`
-- report. Found through the rollups (migration 0029): only the quarter hours whose rollups count
-- an unsettled charge are read from the ledger (by its (company_id, created_at, id) index), so the
-- cost follows the unsettled charges, not the ledger's size. The rollups and the ledger are read
-- in the statement's one snapshot: a charge is counted in both or in neither. PL/pgSQL, not SQL:
-- the function set is also applied to databases migrated only part of the way (a SQL body is
-- checked against tables when it is created), and columns, not the ledger's row type, which
-- migration 0026 replaces.
CREATE FUNCTION capgate_unsettled_charges(p_before timestamptz, p_company uuid DEFAULT NULL)
RETURNS TABLE (id bigint, company_id uuid, user_id uuid, units integer, created_at timestamptz, method text,
               route text, request_id text, idempotency_key text, hold_micros bigint, cost_source text)
LANGUAGE plpgsql STABLE
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH quarters AS (
        SELECT u.company_id, u.bucket
          FROM (SELECT r.company_id, r.bucket, r.unsettled FROM usage_rollups r WHERE r.unsettled <> 0
                UNION ALL
                SELECT c.company_id, c.bucket, c.unsettled FROM usage_rollup_changes c WHERE c.unsettled <> 0) u
         WHERE u.bucket <= p_before AND (p_company IS NULL OR u.company_id = p_company)
         GROUP BY u.company_id, u.bucket
        HAVING sum(u.unsettled) > 0)
    SELECT l.id, l.company_id, l.user_id, l.units, l.created_at, l.method, l.route, l.request_id, l.idempotency_key,
           l.hold_micros, l.cost_source
      FROM quarters q
     CROSS JOIN LATERAL (
        -- OFFSET 0 keeps this a scan per quarter hour (the index's range, the partition pruned
        -- at run time): flattened into a join, a planner misled by old statistics may read the
        -- whole ledger into a hash.
        SELECT l.* FROM usage_ledger l
         WHERE l.company_id = q.company_id AND l.created_at >= q.bucket AND l.created_at < q.bucket + interval '15 minutes'
           AND l.created_at <= p_before AND l.outcome = 'charged' AND l.settled_at IS NULL
        OFFSET 0) l;
END;
$$;
