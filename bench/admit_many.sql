-- pgbench: CapGate's admission alone, spread over 1,000 companies of 10 users.
\set c random(1, 1000)
\set u random(1, 10)
SELECT decision FROM capgate_charge(md5('c' || :c)::uuid, md5('c' || :c || 'u' || :u)::uuid, 1, 'POST', '/v1/messages', 'claude-bench', NULL, 'pgbench', NULL, now());
