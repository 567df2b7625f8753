-- pgbench: the seed design's approach, for comparison: count the period's ledger rows, then
-- insert (racy by construction, and its cost grows with the ledger).
\set u random(1, 640)
SELECT count(*) FROM seed_usage WHERE company_id = md5('seed')::uuid AND created_at >= date_trunc('month', now());
INSERT INTO seed_usage (company_id, user_id, created_at) VALUES (md5('seed')::uuid, md5('seed' || :u)::uuid, now());
