-- Frees the concurrency slots of calls that ended (SPEC §14): their rate_calls rows (written by
-- their admission when they took a slot) go. The ends a gateway notes (an answer's last byte, a
-- client that left) ride its next admission transaction (capgate_slots_free); this writes those
-- no admission took within a few milliseconds, and every admission of that gateway waits for one
-- in flight. The call's token hold is settled by its settlement (capgate_settle_batch), not
-- here. Idempotent: a call whose row is gone changes nothing.
--
-- The deletes are capgate_slots_free's: no counter, window row or ledger row is taken, and a
-- row another transaction holds is skipped (an admission carrying the same end, whose failure
-- hands the end back to the gateway, or a refund deleting it). Committed without waiting for
-- the WAL flush: an end lost in a crash leaves the slot to its lease.
CREATE FUNCTION capgate_rate_end(p_company uuid[], p_ledger bigint[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM capgate_slots_free(p_company, p_ledger);
END;
$$;
