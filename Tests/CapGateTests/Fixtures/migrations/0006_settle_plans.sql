-- Token-count settlement plans each call against the ledger as it is now.
--
-- capgate_settle_batch ran with a generic plan made once per connection. On a new database the
-- ledger is empty when that plan is made, so it scanned the whole ledger for every batch until
-- autovacuum's first ANALYZE replaced the plan (measured: 1,350 sequential scans reading 41.7
-- million rows in the first minute of the benchmark, PostgreSQL CPU climbing from 0.66 to 0.9
-- core). A custom plan sees the ledger's real size and the batch's real length; planning costs
-- well under a millisecond and settlements are written at most every 50 ms per gateway.
ALTER FUNCTION capgate_settle_batch(uuid[], bigint[], integer[], bigint[], bigint[])
    SET plan_cache_mode = force_custom_plan;
