-- Benchmark data: 1,000 companies x 10 users and one hot company with 640 users, every user
-- with an API key cg_bench_c<i>_u<j> / cg_bench_hot_u<j>, on a plan with very large caps.
INSERT INTO plans (id, name, monthly_company_cap, monthly_user_cap, is_default, sort_order)
VALUES ('bench', 'Bench', 1000000000000, 1000000000000, false, 0) ON CONFLICT DO NOTHING;

INSERT INTO companies (id, name) SELECT md5('c' || i)::uuid, 'bench ' || i FROM generate_series(1, 1000) i;
INSERT INTO companies (id, name) VALUES (md5('hot')::uuid, 'bench hot');
INSERT INTO users (company_id, id, role)
SELECT md5('c' || i)::uuid, md5('c' || i || 'u' || j)::uuid, 'member' FROM generate_series(1, 1000) i, generate_series(1, 10) j;
INSERT INTO users (company_id, id, role) SELECT md5('hot')::uuid, md5('hot' || 'u' || j)::uuid, 'member' FROM generate_series(1, 640) j;
INSERT INTO api_keys (company_id, id, user_id, prefix, key_hash)
SELECT md5('c' || i)::uuid, gen_random_uuid(), md5('c' || i || 'u' || j)::uuid, left('cg_bench_c' || i, 11),
       sha256(convert_to('cg_bench_c' || i || '_u' || j, 'UTF8'))
  FROM generate_series(1, 1000) i, generate_series(1, 10) j;
INSERT INTO api_keys (company_id, id, user_id, prefix, key_hash)
SELECT md5('hot')::uuid, gen_random_uuid(), md5('hot' || 'u' || j)::uuid, 'cg_bench_ho',
       sha256(convert_to('cg_bench_hot_u' || j, 'UTF8'))
  FROM generate_series(1, 640) j;
INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, source)
SELECT id, 'bench', date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC',
       date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 'bench'
  FROM companies;
INSERT INTO company_usage (company_id, period_id, used) SELECT company_id, id, 0 FROM plan_periods;
-- Steady state: every user's counter row for the period exists (a user's first call in a
-- period otherwise creates it; on a freshly seeded database the first scenario would pay
-- for 10,640 of those inserts).
INSERT INTO user_usage (company_id, period_id, user_id, used)
SELECT p.company_id, p.id, u.id, 0 FROM plan_periods p JOIN users u ON u.company_id = p.company_id;

-- The seed design's table for the COUNT(*)-then-INSERT comparison.
CREATE TABLE IF NOT EXISTS seed_usage (company_id uuid NOT NULL, user_id uuid NOT NULL, created_at timestamptz NOT NULL);
CREATE INDEX IF NOT EXISTS seed_usage_company_time ON seed_usage (company_id, created_at);
ANALYZE;
