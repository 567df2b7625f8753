-- Cost budgets on every call (SPEC §11; `bench.py --budgets`): the benchmark's model priced
-- through a prefix row (the lookup tries the exact id, then each prefix), and the bench plan
-- given a company and a user budget far above what a run spends, so every call is held,
-- checked against both budgets and settled, and none is refused.
INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, cache_read)
VALUES ('claude-*', '2020-01-01Z', 200000, 3000000, 15000000, 3750000, 6000000, 300000)
ON CONFLICT DO NOTHING;
UPDATE plans SET monthly_company_budget = 100000000000000, monthly_user_budget = 10000000000000 WHERE id = 'bench';
ANALYZE prices;
