-- Frees the concurrency slots of calls that ended (SPEC §14): their rate_slots rows (taken by
-- their admission) are free for their users' next calls. The ends a gateway notes (an answer's last byte, a
-- client that left) ride its next admission transaction (capgate_slots_free); this writes those
-- no admission took within a few milliseconds, and every admission of that gateway waits for one
-- in flight. The call's token hold is settled by its settlement (capgate_settle_batch), not
-- here. Idempotent: a call that no longer holds its row changes nothing.
--
-- The updates are capgate_slots_free's: no counter, window row or ledger row is taken, and a
-- row another transaction holds is skipped (an admission carrying the same end, whose failure
-- hands the end back to the gateway, or a refund freeing it). Committed without waiting for
-- the WAL flush: an end lost in a crash leaves the slot to its lease.
CREATE FUNCTION capgate_rate_end(p_company uuid[], p_user uuid[], p_ledger bigint[])
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM capgate_slots_free(p_company, p_user, p_ledger);
END;
$$;
