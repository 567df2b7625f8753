-- The exact count of a plan token window (SPEC §14) in p_minute: the company's (p_user NULL) or
-- the user's. Every call charged in the window (usage_ledger.rate_minute, rate_scopes bit 32 for
-- the company's, 64 for the user's) with its real count once settled, its hold until then
-- (usage_ledger.rate_tokens); a refunded call is out. Read through usage_ledger_rate. The
-- counter rows keep only an upper bound (the settlement no longer writes them, migration 0022);
-- an admission the bound would refuse reads this, under the counter row's lock, and decides on
-- it. Committed settlements are seen, so the decision is the one an eagerly settled counter
-- gave; a settlement not yet committed still counts its hold (never less than the call).
CREATE FUNCTION capgate_rate_recount(p_company uuid, p_user uuid, p_minute timestamptz)
RETURNS bigint
LANGUAGE plpgsql STABLE
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_tokens bigint;
BEGIN
    -- Each branch names the index's predicate, so its plan uses the partial index
    -- usage_ledger_rate (company, minute[, user]).
    IF p_user IS NULL THEN
        SELECT sum(l.rate_tokens) INTO v_tokens FROM usage_ledger l
         WHERE l.company_id = p_company AND l.rate_minute = p_minute AND (l.rate_scopes & 96) <> 0
           AND (l.rate_scopes & 32) <> 0 AND l.outcome = 'charged';
    ELSE
        SELECT sum(l.rate_tokens) INTO v_tokens FROM usage_ledger l
         WHERE l.company_id = p_company AND l.rate_minute = p_minute AND l.user_id = p_user
           AND (l.rate_scopes & 96) <> 0 AND (l.rate_scopes & 64) <> 0 AND l.outcome = 'charged';
    END IF;
    RETURN coalesce(v_tokens, 0);
END;
$$;
