-- pgbench: CapGate's admission alone, every call on ONE company's counter (640 users).
\set u random(1, 640)
SELECT decision FROM capgate_charge(md5('hot')::uuid, md5('hot' || 'u' || :u)::uuid, 1, 'POST', '/v1/messages', 'claude-bench', NULL, 'pgbench', NULL, now());
