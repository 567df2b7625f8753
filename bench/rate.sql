-- Rate windows on every call (SPEC §14; `bench.py --rate`): per-minute call and token windows for
-- the company and each user and a concurrency limit, all far above what a run reaches, so every
-- call is counted in both minute rows, takes and frees a slot, and ends its token hold, and none
-- is refused.
UPDATE plans SET company_rpm = 1000000000, user_rpm = 1000000000, company_tpm = 1000000000000,
                 user_tpm = 1000000000000, user_concurrency = 1000000
 WHERE id = 'bench';
