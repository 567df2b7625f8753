-- One counter row of a batch as capgate_batch_lock (or capgate_batch_lock_windows) locked it,
-- then as capgate_batch_decide moved it in memory; capgate_batch_write writes what moved.
--
-- The same shape for every kind, each kind in an array of its own in key order (a call finds its
-- rows by index, capgate_batch_call's cslot, uslot, fps, fds, ups, uds): company_usage (company_id,
-- period_id), user_usage (with user_id), company_feature_usage (company_id, feature_id, starts_at),
-- user_feature_usage (with user_id), rate_windows (company_id, user_id: the owner, the nil UUID
-- for the company's, feature_id). Columns a kind does not have are NULL.
-- used, cost_used, cost_held: the unit and cost counters; rate_minute, rate_calls, rate_tokens:
--   the rate window the row holds (SPEC §14); slots: the owner's calls in flight (NULL where no
--   concurrency limit applies); moved: a rate window row the batch counted a call in.
CREATE TYPE capgate_batch_counter AS (
    company_id uuid, period_id bigint, user_id uuid, feature_id text, starts_at timestamptz,
    used bigint, cost_used bigint, cost_held bigint,
    rate_minute timestamptz, rate_calls bigint, rate_tokens bigint, slots bigint, moved boolean
);
