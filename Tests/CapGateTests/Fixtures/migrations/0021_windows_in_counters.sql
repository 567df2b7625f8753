-- The plan's rate windows (SPEC §14) move into the period counter rows (issue #31, speed): the
-- company's minute window into company_usage, each user's into user_usage. Every admission
-- already locks and writes those two rows; a separate rate_windows row for each of them cost the
-- batch two more row locks and writes per call (call windows only: -14 % at concurrency 64,
-- BENCHMARKS.md session 22). rate_windows keeps the windows of a feature's entitlement.
--
-- rate_minute: the UTC minute rate_calls and rate_tokens belong to (NULL: never counted). A row
-- on an earlier minute starts again at zero with the call that finds it so. A period that starts
-- inside a minute starts from the counts of the periods it follows in that minute (read once, by
-- the first call counted in the new row: capgate_rate_carry), so a new period, a plan change
-- included, opens no second window in one minute.
ALTER TABLE company_usage
    ADD COLUMN rate_minute timestamptz,
    ADD COLUMN rate_calls bigint NOT NULL DEFAULT 0,
    ADD COLUMN rate_tokens bigint NOT NULL DEFAULT 0;
ALTER TABLE user_usage
    ADD COLUMN rate_minute timestamptz,
    ADD COLUMN rate_calls bigint NOT NULL DEFAULT 0,
    ADD COLUMN rate_tokens bigint NOT NULL DEFAULT 0;

-- The current minute's plan windows, carried into the counters of the period that holds it.
UPDATE company_usage cu
   SET rate_minute = w.minute, rate_calls = w.calls, rate_tokens = w.tokens
  FROM rate_windows w JOIN plan_periods pp ON pp.company_id = w.company_id
 WHERE w.user_id = '00000000-0000-0000-0000-000000000000' AND w.feature_id = ''
   AND w.minute >= date_trunc('minute', now(), 'UTC')
   AND pp.started_at <= w.minute AND pp.ends_at > w.minute
   AND cu.company_id = pp.company_id AND cu.period_id = pp.id;
UPDATE user_usage uu
   SET rate_minute = w.minute, rate_calls = w.calls, rate_tokens = w.tokens
  FROM rate_windows w JOIN plan_periods pp ON pp.company_id = w.company_id
 WHERE w.user_id <> '00000000-0000-0000-0000-000000000000' AND w.feature_id = ''
   AND w.minute >= date_trunc('minute', now(), 'UTC')
   AND pp.started_at <= w.minute AND pp.ends_at > w.minute
   AND uu.company_id = pp.company_id AND uu.period_id = pp.id AND uu.user_id = w.user_id;
DELETE FROM rate_windows WHERE feature_id = '';

-- rate_calls now holds only the calls that took a concurrency slot: a call's token hold is
-- settled from its ledger row (rate_minute, rate_tokens, rate_scopes) by its settlement, which
-- then writes the real count in rate_tokens (what a later refund gives back). A row that held
-- tokens only is dropped: its hold stays in a minute that is over.
DELETE FROM rate_calls WHERE (scopes & 4) = 0;
