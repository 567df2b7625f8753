-- Per-minute call windows only (`bench.py --rate-rpm`): the company's and each user's rpm far
-- above what a run reaches, no token window and no concurrency limit, so every call is counted in
-- two minute rows at admission and its end has nothing to write.
UPDATE plans SET company_rpm = 1000000000, user_rpm = 1000000000 WHERE id = 'bench';
