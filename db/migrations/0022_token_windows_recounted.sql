-- The plan's token windows (SPEC §14) are settled from the ledger, not by the settlement (issue
-- #31, speed): a call's settlement no longer locks and writes the company's and the user's counter
-- rows to trade its hold for its real count. It writes the real count on the call's ledger row
-- only (rate_tokens, as before), and the counter rows' rate_tokens becomes an upper bound of the
-- window: the holds it took, less what refunds gave back. An admission that the bound would
-- refuse counts the window exactly from the ledger (capgate_rate_recount: every call charged in
-- the minute, its real count once settled, its hold until then) and decides on that, so the
-- decision is the one an eagerly settled counter gave, and the bound is corrected there. (The
-- settlement's counter writes were a third of the whole cost of the five windows at
-- concurrency 64: BENCHMARKS.md session 27.)
--
-- rate_scopes gains two bits: 32, the call holds tokens in the company's plan token window
-- (company_tpm set), 64 in the user's (user_tpm set). These two indexes, holding only such calls,
-- are what the recount reads: the company's minute, the user's minute.
CREATE INDEX usage_ledger_rate_company ON usage_ledger (company_id, rate_minute) WHERE (rate_scopes & 32) <> 0;
CREATE INDEX usage_ledger_rate_user ON usage_ledger (company_id, user_id, rate_minute) WHERE (rate_scopes & 64) <> 0;
