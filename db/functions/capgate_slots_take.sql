-- Charged calls take a concurrency slot each (SPEC §14), inside their admission transaction,
-- which holds their users' counter rows (so no other admission of those users runs meanwhile):
-- each call takes one of its user's free rows (rate_slots: freed by an end, or taken by a call
-- whose lease is over), in slot order, and a call that finds none left gets a new row numbered
-- with its own ledger id. Taking a row is an update in place (migration 0023). A row that changed
-- under the statement (an end or a lease purge of another transaction) is re-checked: if it is no
-- longer free its call gets a new row instead.
--
-- p_lease: each call's lease end (its admission time plus rate.leaseSeconds); p_feature '' for
-- none.
CREATE FUNCTION capgate_slots_take(p_company uuid[], p_user uuid[], p_feature text[], p_ledger bigint[], p_lease timestamptz[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    WITH calls AS (
        SELECT c.co, c.u, c.f, c.ledger, c.lease, row_number() OVER (PARTITION BY c.co, c.u ORDER BY c.ledger) AS rank
          FROM unnest(p_company, p_user, p_feature, p_ledger, p_lease) AS c(co, u, f, ledger, lease)
    ), free AS (
        SELECT s.company_id, s.user_id, s.slot,
               row_number() OVER (PARTITION BY s.company_id, s.user_id ORDER BY s.slot) AS rank
          FROM (SELECT DISTINCT co, u FROM calls) o
          JOIN rate_slots s ON s.company_id = o.co AND s.user_id = o.u
         WHERE s.ledger_id IS NULL OR s.lease_until <= now()
    ), taken AS (
        UPDATE rate_slots s SET ledger_id = c.ledger, feature_id = c.f, lease_until = c.lease
          FROM calls c JOIN free f ON f.company_id = c.co AND f.user_id = c.u AND f.rank = c.rank
         WHERE s.company_id = f.company_id AND s.user_id = f.user_id AND s.slot = f.slot
           AND (s.ledger_id IS NULL OR s.lease_until <= now())
        RETURNING c.ledger
    )
    INSERT INTO rate_slots (company_id, user_id, slot, ledger_id, feature_id, lease_until)
    SELECT c.co, c.u, c.ledger, c.ledger, c.f, c.lease
      FROM calls c
     WHERE c.ledger NOT IN (SELECT t.ledger FROM taken t);
END;
$$;
