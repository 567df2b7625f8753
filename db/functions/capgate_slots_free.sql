-- Frees the concurrency slots of calls that ended (SPEC §14) inside an admission transaction of
-- the gateway that served them: the gateway hands each admission transaction the ends it noted
-- since the previous one (its answers' last bytes went out after they were noted), so a call it
-- admits after an answer ended never counts that answer's slot, and no end needs a transaction
-- of its own while the gateway admits. Ends it has no admission for are written by
-- capgate_rate_end a few milliseconds later.
--
-- A freed slot row stays for the user's next call to take (rate_slots, migration 0023): the
-- update is in place. A row another transaction holds is skipped, never waited for: an
-- admission then never waits on a slot row while it holds counters. (The other writers of a
-- taken row: an end carried by another transaction, whose failure hands the end back to the
-- gateway; a refund freeing it; an admission taking it once its lease is over.) Idempotent: a
-- call that no longer holds its row changes nothing. Called before the admission counts live
-- slots.
CREATE FUNCTION capgate_slots_free(p_company uuid[], p_user uuid[], p_ledger bigint[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    UPDATE rate_slots s SET ledger_id = NULL
      FROM (SELECT r.company_id, r.user_id, r.slot
              FROM unnest(p_company, p_user, p_ledger) AS e(co, u, id)
              JOIN rate_slots r ON r.company_id = e.co AND r.user_id = e.u AND r.ledger_id = e.id
               FOR UPDATE OF r SKIP LOCKED) k
     WHERE s.company_id = k.company_id AND s.user_id = k.user_id AND s.slot = k.slot;
END;
$$;
