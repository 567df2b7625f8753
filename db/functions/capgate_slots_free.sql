-- Frees the concurrency slots of calls that ended (SPEC §14) inside an admission transaction of
-- the gateway that served them: the gateway hands each admission transaction the ends it noted
-- since the previous one (its answers' last bytes went out after they were noted), so a call it
-- admits after an answer ended never counts that answer's slot, and no end needs a transaction
-- of its own while the gateway admits. Ends it has no admission for are written by
-- capgate_rate_end a few milliseconds later.
--
-- A row another transaction holds is skipped, never waited for: an admission then never waits on
-- a slot row while it holds counters. (The only other writers of these rows delete them: an end
-- written by capgate_rate_end, a refund, the lease purge. A refund is given only to a call that
-- did not serve an answer, which has no end.) Idempotent: a call whose row is gone changes
-- nothing. Called before the admission counts live slots.
CREATE FUNCTION capgate_slots_free(p_company uuid[], p_ledger bigint[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    DELETE FROM rate_calls c
     USING (SELECT r.company_id, r.ledger_id
              FROM unnest(p_company, p_ledger) AS s(co, id)
              JOIN rate_calls r ON r.company_id = s.co AND r.ledger_id = s.id
               FOR UPDATE OF r SKIP LOCKED) k
     WHERE c.company_id = k.company_id AND c.ledger_id = k.ledger_id;
END;
$$;
