-- The ledger at scale (issue #50 item 4): what `bench.py --scale` runs to fill `usage_ledger` with
-- N rows over 12 UTC months for the seeded companies (bench/seed.sql), in SQL, not through the
-- gateway. This file only defines the schema `bench_scale` and its functions; bench.py calls them:
--
--   SELECT bench_scale.prepare(12);                       -- periods, partitions, progress table
--   SELECT bench_scale.fill_month('2026-01-01Z', 4166667); -- one month, one statement; per month
--   SELECT bench_scale.finish();                           -- the counters of every period filled
--
-- Every row is what a settled, priced call writes: outcome 'charged', one unit, a model, input and
-- output tokens, its cost (`cost_source` 'usage', `hold_micros` the same), `settled_at` two seconds
-- after `created_at`, upstream status 200; no feature, no grant, no Idempotency-Key (most calls
-- have none). The rows go through the parent table with the rollup triggers on, as the gateway's
-- own statements do: each month's statement appends its rollup parts to `usage_rollup_changes`,
-- and `capgate_rollup_compact()` moves them into `usage_rollups` after it, so the rollups are the
-- product's own and `capgate verify` checks them like any others (no `capgate_rollup_rebuild()`).
--
-- The companies: the hot company (640 users) is the biggest, with `hot_share` of the rows (8 % by
-- default); the other rows go to the 1,000 companies `bench i` (10 users each), skewed towards
-- the low numbers (company 1 about 60 times company 1,000). Within a month the rows are spread
-- evenly over time, in time order, as a month of calls arrives (each company's index entries are
-- appended at its end, as in production); the current month is filled up to `now()` less an hour.
-- One plan period per company per UTC month (the seed made the current one); its counters
-- (`company_usage`, `user_usage`: units and cost) are set from the rows by `finish()`.
--
-- Resumable: `bench_scale.progress` records each month once its statement committed; bench.py
-- skips the months recorded (a month whose statement failed holds none of its rows).
CREATE SCHEMA IF NOT EXISTS bench_scale;

CREATE TABLE IF NOT EXISTS bench_scale.progress (
    month timestamptz PRIMARY KEY,
    rows bigint NOT NULL,
    seconds double precision NOT NULL,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The companies by number: 0 is the hot company, 1..1000 the `bench i` companies.
CREATE OR REPLACE FUNCTION bench_scale.company(n integer) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(CASE WHEN n = 0 THEN 'hot' ELSE 'c' || n END)::uuid
$$;

-- The months to fill, oldest first: the current UTC month and the `months - 1` before it.
CREATE OR REPLACE FUNCTION bench_scale.months(months integer) RETURNS SETOF timestamptz
LANGUAGE sql STABLE AS $$
    SELECT (date_trunc('month', now() AT TIME ZONE 'UTC') - make_interval(months => k)) AT TIME ZONE 'UTC'
      FROM generate_series(months - 1, 0, -1) k
$$;

-- A plan period per company for each month before the seeded one (the bench plan, the month's
-- bounds, the seed's anchor), their empty counters, and the ledger's partitions of every month.
CREATE OR REPLACE FUNCTION bench_scale.prepare(months integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_first timestamptz := (SELECT min(m) FROM bench_scale.months(months) m);
BEGIN
    INSERT INTO plan_periods (company_id, plan_id, started_at, ends_at, anchor, source)
    SELECT c.id, 'bench', m, (m AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC',
           date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', 'bench'
      FROM companies c, bench_scale.months(months) m
     WHERE NOT EXISTS (SELECT 1 FROM plan_periods p WHERE p.company_id = c.id AND p.started_at = m);
    INSERT INTO company_usage (company_id, period_id, used)
    SELECT company_id, id, 0 FROM plan_periods ON CONFLICT DO NOTHING;
    PERFORM capgate_ledger_partitions_ahead(months - 1, v_first);
END;
$$;

-- One month's rows in one statement: `n` rows over [month, next month) (the current month: up to
-- an hour ago), in time order. Returns the rows written; records the month in `progress`.
CREATE OR REPLACE FUNCTION bench_scale.fill_month(month timestamptz, n bigint, hot_share double precision DEFAULT 0.08)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_end timestamptz := least((month AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC', now() - interval '1 hour');
    v_span double precision := extract(epoch FROM v_end - month);
    v_tag text := to_char(month AT TIME ZONE 'UTC', 'YYYYMM');
    v_started timestamptz := clock_timestamp();
    v_rows bigint;
    v_periods bigint[];
    v_companies uuid[];
BEGIN
    IF EXISTS (SELECT 1 FROM bench_scale.progress p WHERE p.month = fill_month.month) THEN
        RETURN 0;
    END IF;
    -- The same rows for the same month and size, run after run.
    PERFORM setseed(((extract(epoch FROM month)::bigint % 100000) / 100000.0)::double precision);
    -- The month's period of each company by number (index k + 1), so that the rows need no join
    -- and stay in generate_series's order.
    SELECT array_agg(p.id ORDER BY k), array_agg(p.company_id ORDER BY k) INTO v_periods, v_companies
      FROM generate_series(0, 1000) k JOIN plan_periods p ON p.company_id = bench_scale.company(k) AND p.started_at = month;
    IF cardinality(v_periods) IS DISTINCT FROM 1001 THEN
        RAISE EXCEPTION 'bench_scale: % has % plan periods of the 1,001 companies', month, cardinality(v_periods);
    END IF;

    INSERT INTO usage_ledger (company_id, period_id, user_id, units, input_tokens, output_tokens, method, route, model,
                              request_id, outcome, upstream_status, created_at, settled_at, hold_micros, cost_micros, cost_source)
    SELECT v_companies[g.k + 1], v_periods[g.k + 1],
           md5(CASE WHEN g.k = 0 THEN 'hotu' || (1 + g.u % 640) ELSE 'c' || g.k || 'u' || (1 + g.u % 10) END)::uuid,
           1, g.input, g.output, 'POST', '/v1/messages',
           CASE WHEN g.u % 4 = 0 THEN 'claude-opus-bench' ELSE 'claude-bench' END,
           'scale_' || v_tag || '_' || g.i, 'charged', 200, g.at, g.at + interval '2 seconds',
           g.input * 3 + g.output * 15, g.input * 3 + g.output * 15, 'usage'
      FROM (SELECT i,
                   month + make_interval(secs => (i - 1 + random()) * v_span / n) AS at,
                   CASE WHEN r < hot_share THEN 0
                        ELSE 1 + least(999, floor(1000 * power((r - hot_share) / (1 - hot_share), 2)))::integer END AS k,
                   (random() * 1000000)::integer AS u,
                   (200 + random() * 3000)::bigint AS input,
                   (20 + random() * 800)::bigint AS output
              FROM (SELECT i, random() AS r FROM generate_series(1, n) i) s) g;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    INSERT INTO bench_scale.progress (month, rows, seconds)
    VALUES (month, v_rows, extract(epoch FROM clock_timestamp() - v_started));
    RETURN v_rows;
END;
$$;

-- Every period's counters from the ledger's rows: units and cost, the company's and each user's
-- (the cost held is 0: every row is settled). One pass over the ledger's charged rows; run
-- before any call goes through a gateway (the ledger then holds only the filled rows).
CREATE OR REPLACE FUNCTION bench_scale.finish() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    CREATE TEMP TABLE bench_scale_users ON COMMIT DROP AS
    SELECT company_id, period_id, user_id, sum(units) AS used, sum(user_cost_used) AS cost_used,
           sum(company_units) AS company_used, sum(company_cost_used) AS company_cost_used
      FROM usage_ledger_charged
     GROUP BY 1, 2, 3;
    INSERT INTO user_usage AS u (company_id, period_id, user_id, used, cost_used)
    SELECT company_id, period_id, user_id, used, cost_used FROM bench_scale_users
    ON CONFLICT (company_id, period_id, user_id) DO UPDATE SET used = excluded.used, cost_used = excluded.cost_used;
    UPDATE company_usage c SET used = t.used, cost_used = t.cost_used
      FROM (SELECT company_id, period_id, sum(company_used) AS used, sum(company_cost_used) AS cost_used
              FROM bench_scale_users GROUP BY 1, 2) t
     WHERE c.company_id = t.company_id AND c.period_id = t.period_id;
END;
$$;
