-- Frees the concurrency slots of calls that ended (SPEC §14): their rate_calls rows (written by
-- their admission when they took a slot) go. A gateway notes its calls' ends (an answer's last
-- byte, a client that left) and writes them here, many at once, within milliseconds; until this
-- commits, its admissions do not count those rows (their p_ended), so a call it admits after an
-- answer ended finds the slot free, and no admission waits for this or does it itself (measured,
-- session 31: the delete inside the admission was 0.3 ms of a ~5.5 ms batch of ~30 calls, on the
-- one transaction every caller of the gateway waits for). The other gateways see the slot free
-- when this commits. The call's token hold is settled by its settlement (capgate_settle_batch),
-- not here. Idempotent: a call whose row is gone changes nothing.
--
-- A row another transaction holds is skipped, never waited for: the only other writers of these
-- rows delete them (a refund, the lease purge) or extend their lease (this gateway's renewal,
-- which it runs in turn with these writes). Committed without waiting for the WAL flush: an end
-- lost in a crash leaves the slot to its lease.
CREATE FUNCTION capgate_rate_end(p_company uuid[], p_ledger bigint[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM rate_calls c
     USING (SELECT r.company_id, r.ledger_id
              FROM unnest(p_company, p_ledger) AS s(co, id)
              JOIN rate_calls r ON r.company_id = s.co AND r.ledger_id = s.id
               FOR UPDATE OF r SKIP LOCKED) k
     WHERE c.company_id = k.company_id AND c.ledger_id = k.ledger_id;
END;
$$;
