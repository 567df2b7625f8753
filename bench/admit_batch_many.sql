-- pgbench: CapGate's batched admission alone, 32 calls per transaction (one capgate_admit_batch
-- call, as the gateway sends what queued while the previous batch committed), spread over 1,000 companies of 10 users.
WITH x AS (SELECT (random() * 999 + 1)::int AS c, (random() * 9 + 1)::int AS u FROM generate_series(1, 32)),
     a AS (SELECT array_agg(md5('c' || c)::uuid) AS companies, array_agg(md5('c' || c || 'u' || u)::uuid) AS users FROM x)
SELECT count(*) FROM a, capgate_admit_batch(
    array_fill(''::bytea, ARRAY[32]), a.companies, a.users, array_fill(1, ARRAY[32]), array_fill('POST'::text, ARRAY[32]),
    array_fill('/v1/messages'::text, ARRAY[32]), array_fill('claude-bench'::text, ARRAY[32]), array_fill(''::text, ARRAY[32]),
    array_fill('pgbench'::text, ARRAY[32]), array_fill(-1::bigint, ARRAY[32]), array_fill(now(), ARRAY[32]), false,
    array_fill(1000::bigint, ARRAY[32]), array_fill(16::bigint, ARRAY[32]), array_fill(0::smallint, ARRAY[32]),
    array_fill(0::bigint, ARRAY[32]));
