-- Step 2b of capgate_admit_batch, after every counter (capgate_batch_lock): the rate windows of
-- the calls' feature entitlements (SPEC §14). Their rows (rate_windows, the company's with the
-- nil UUID as owner, then each user's) locked in key order, created at zero when new, each with
-- its owner's live slots of that feature where a concurrency limit applies (p_ended: calls that
-- ended, not live); wfc, wfu: each call's rows (company x feature, user x feature) by index, NULL
-- where it has none. capgate_batch_decide decides them in memory as it decides the counters.
-- The plan's windows are in the company and user counter rows capgate_batch_lock locked.
CREATE FUNCTION capgate_batch_lock_windows(
    p_calls capgate_batch_call[], p_ended bigint[],
    OUT w_rows capgate_batch_counter[], OUT wfc integer[], OUT wfu integer[]
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    WITH calls AS (
        SELECT s.ord, s.company AS c, s.at, o.bit, o.owner, o.feature, o.conc
          FROM unnest(p_calls) s
         CROSS JOIN LATERAL (VALUES
               (8, '00000000-0000-0000-0000-000000000000'::uuid, s.feature, s.fcrpm IS NOT NULL OR s.fctpm IS NOT NULL, false),
               (16, s.user_id, s.feature, s.furpm IS NOT NULL OR s.futpm IS NOT NULL OR s.fconc IS NOT NULL,
                s.fconc IS NOT NULL))
               AS o(bit, owner, feature, applies, conc)
         WHERE o.applies AND o.feature IS NOT NULL AND s.uslot IS NOT NULL AND s.units > 0
    ), keys AS (
        SELECT k.*, row_number() OVER (ORDER BY k.c, k.owner, k.feature)::integer AS idx
          FROM (SELECT calls.c, calls.owner, calls.feature, min(date_trunc('minute', calls.at, 'UTC')) AS minute,
                       min(calls.at) AS at, bool_or(calls.conc) AS conc
                  FROM calls GROUP BY calls.c, calls.owner, calls.feature) k
    ), locked AS (
        INSERT INTO rate_windows AS w (company_id, user_id, feature_id, minute, calls, tokens)
        SELECT k.c, k.owner, k.feature, k.minute, 0, 0 FROM keys k ORDER BY k.idx
        ON CONFLICT (company_id, user_id, feature_id) DO UPDATE SET calls = w.calls
        RETURNING w.company_id, w.user_id, w.feature_id, w.minute, w.calls, w.tokens
    ), rows AS (
        SELECT k.idx, l.*,
               -- Live slots are counted only where a concurrency limit applies.
               CASE WHEN NOT k.conc THEN 0
                    ELSE (SELECT count(*) FROM rate_calls rc
                           WHERE rc.company_id = k.c AND rc.user_id = k.owner AND (rc.scopes & 4) <> 0
                             AND rc.lease_until > k.at AND rc.feature_id = k.feature
                             AND rc.ledger_id <> ALL (p_ended)) END AS slots
          FROM keys k JOIN locked l ON l.company_id = k.c AND l.user_id = k.owner AND l.feature_id = k.feature
    ), slots AS (
        SELECT c.ord, max(CASE WHEN c.bit = 8 THEN k.idx END) AS fc, max(CASE WHEN c.bit = 16 THEN k.idx END) AS fu
          FROM calls c JOIN keys k ON k.c = c.c AND k.owner = c.owner AND k.feature = c.feature
         GROUP BY c.ord
    )
    SELECT (SELECT array_agg(ROW(r.company_id, NULL, r.user_id, r.feature_id, NULL, NULL, NULL, NULL, r.minute, r.calls,
                                 r.tokens, r.slots, false)::capgate_batch_counter ORDER BY r.idx)
              FROM rows r),
           (SELECT array_agg(x.fc ORDER BY o) FROM generate_series(1, cardinality(p_calls)) o LEFT JOIN slots x ON x.ord = o),
           (SELECT array_agg(x.fu ORDER BY o) FROM generate_series(1, cardinality(p_calls)) o LEFT JOIN slots x ON x.ord = o)
      INTO w_rows, wfc, wfu;
END;
$$;
