-- Rate windows on every call (SPEC §14; `bench.py --rate`): per-minute call and token windows for
-- the company and each user and a concurrency limit, all far above what a run reaches, so every
-- call is counted in both minute rows, takes and frees a slot, and ends its token hold, and none
-- is refused. A token window bounds only a priced call (SPEC §11), so the model is priced as
-- `bench/budgets.sql` prices it (no budget: each call is also held and settled at its cost).
INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read)
VALUES ('claude-*', '2020-01-01Z', 200000, 3000000, 15000000, 3750000, 6000000, 300000)
ON CONFLICT DO NOTHING;
ANALYZE prices;
UPDATE plans SET company_rpm = 1000000000, user_rpm = 1000000000, company_tpm = 1000000000000,
                 user_tpm = 1000000000000, user_concurrency = 1000000
 WHERE id = 'bench';
