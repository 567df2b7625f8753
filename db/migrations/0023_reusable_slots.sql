-- A user's concurrency slots (SPEC §14) are rows that calls reuse (issue #31, speed): rate_slots
-- replaces rate_calls, a row per call in flight that its admission inserted (a heap tuple and two
-- index entries) and its end deleted (a dead tuple the next counts walked until vacuum took it).
-- A slot row is taken by a call (ledger_id set, lease_until its lease) and freed by its end
-- (ledger_id NULL): both are updates of columns no index covers, so PostgreSQL writes them in
-- place on the same page (HOT), with no index entry and no dead tuple for vacuum to find. A user
-- has as many rows as it ever had calls in flight at once; its admissions count the taken ones
-- (under the user's counter lock, as before).
--
-- slot: the ledger id of the call that created the row (unique, so two admissions of one user
-- that ever race at a period boundary cannot collide on a number). ledger_id: the call holding
-- it, NULL when free. feature_id: that call's feature ('' for none). lease_until: when a taken
-- slot stops counting if its gateway dies (rate.leaseSeconds after its admission); an expired
-- slot is free to take again. A row unused for an hour past its lease is deleted by the
-- gateways' hourly job. fillfactor 50: room on each page for the in-place versions.
CREATE TABLE rate_slots (
    company_id uuid NOT NULL,
    user_id uuid NOT NULL,
    slot bigint NOT NULL,
    ledger_id bigint,
    feature_id text NOT NULL DEFAULT '',
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (company_id, user_id, slot)
) WITH (fillfactor = 50);

-- The calls in flight at the upgrade keep their slots until their end or lease.
INSERT INTO rate_slots (company_id, user_id, slot, ledger_id, feature_id, lease_until)
SELECT company_id, user_id, ledger_id, ledger_id, feature_id, lease_until
  FROM rate_calls
 WHERE (scopes & 4) <> 0 AND lease_until > now();

DROP TABLE rate_calls;
