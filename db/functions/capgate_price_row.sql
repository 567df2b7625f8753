-- capgate_price for a single call's admission (capgate_charge): the same row, from a statement
-- planned once per session. Called as a statement of PL/pgSQL, the inlined SQL function was
-- planned again for every call (custom plans: its candidate patterns fold to constants), 0.1 ms of
-- a lone call's admission under a budget (measured with pg_stat_statements, session 23). A generic
-- plan is safe here: the price book is small and read by its primary key's index.
CREATE FUNCTION capgate_price_row(p_model text, p_at timestamptz) RETURNS prices
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r prices;
BEGIN
    SELECT q.* INTO r FROM capgate_price(p_model, p_at) q;
    RETURN r;
END;
$$;
