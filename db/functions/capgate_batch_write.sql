-- Step 4 of capgate_admit_batch: what capgate_batch_decide moved, written: the feature rate
-- windows that counted a call, the slots of the charged calls that hold one (until their end,
-- capgate_rate_end, or their lease, p_lease seconds), the counters that changed and the ledger rows
-- of the charged calls (their parts paid by top-up grants: units_grant_part, cost_grant_part).
CREATE FUNCTION capgate_batch_write(
    p_calls capgate_batch_call[], p_outcomes capgate_batch_outcome[], p_lease integer,
    c_rows capgate_batch_counter[], u_rows capgate_batch_counter[], fp_rows capgate_batch_counter[],
    fd_rows capgate_batch_counter[], up_rows capgate_batch_counter[], ud_rows capgate_batch_counter[],
    w_rows capgate_batch_counter[]
) RETURNS void
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF w_rows IS NOT NULL THEN
        UPDATE rate_windows rw SET minute = s.rate_minute, calls = s.rate_calls, tokens = s.rate_tokens
          FROM unnest(w_rows) s
         WHERE s.moved AND rw.company_id = s.company_id AND rw.user_id = s.user_id AND rw.feature_id = s.feature_id;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_outcomes) o WHERE (o.rscopes & 4) <> 0) THEN
        INSERT INTO rate_calls (company_id, ledger_id, user_id, feature_id, minute, tokens, scopes, lease_until)
        SELECT c.company, o.ledger, c.user_id, coalesce(c.feature, ''), o.rmin, o.rtok, o.rscopes,
               c.at + make_interval(secs => p_lease)
          FROM unnest(p_calls) WITH ORDINALITY c JOIN unnest(p_outcomes) WITH ORDINALITY o ON o.ordinality = c.ordinality
         WHERE o.decision = 'charged' AND (o.rscopes & 4) <> 0;
    END IF;
    UPDATE company_usage cu SET used = s.used, cost_held = s.cost_held, rate_minute = s.rate_minute,
                                rate_calls = s.rate_calls, rate_tokens = s.rate_tokens
      FROM unnest(c_rows) s
     WHERE cu.company_id = s.company_id AND cu.period_id = s.period_id
       AND (cu.used <> s.used OR cu.cost_held <> s.cost_held OR cu.rate_calls <> s.rate_calls
            OR cu.rate_tokens <> s.rate_tokens OR cu.rate_minute IS DISTINCT FROM s.rate_minute);
    UPDATE user_usage uu SET used = s.used, cost_held = s.cost_held, rate_minute = s.rate_minute,
                             rate_calls = s.rate_calls, rate_tokens = s.rate_tokens
      FROM unnest(u_rows) s
     WHERE uu.company_id = s.company_id AND uu.period_id = s.period_id AND uu.user_id = s.user_id
       AND (uu.used <> s.used OR uu.cost_held <> s.cost_held OR uu.rate_calls <> s.rate_calls
            OR uu.rate_tokens <> s.rate_tokens OR uu.rate_minute IS DISTINCT FROM s.rate_minute);
    IF fp_rows IS NOT NULL THEN
        UPDATE company_feature_usage fu SET used = s.used
          FROM unnest(fp_rows) s
         WHERE fu.company_id = s.company_id AND fu.feature_id = s.feature_id AND fu.span = 'period'
           AND fu.starts_at = s.starts_at AND fu.used <> s.used;
        UPDATE company_feature_usage fu SET used = s.used
          FROM unnest(fd_rows) s
         WHERE fu.company_id = s.company_id AND fu.feature_id = s.feature_id AND fu.span = 'day'
           AND fu.starts_at = s.starts_at AND fu.used <> s.used;
        UPDATE user_feature_usage fu SET used = s.used
          FROM unnest(up_rows) s
         WHERE fu.company_id = s.company_id AND fu.user_id = s.user_id AND fu.feature_id = s.feature_id
           AND fu.span = 'period' AND fu.starts_at = s.starts_at AND fu.used <> s.used;
        UPDATE user_feature_usage fu SET used = s.used
          FROM unnest(ud_rows) s
         WHERE fu.company_id = s.company_id AND fu.user_id = s.user_id AND fu.feature_id = s.feature_id
           AND fu.span = 'day' AND fu.starts_at = s.starts_at AND fu.used <> s.used;
    END IF;
    INSERT INTO usage_ledger (id, company_id, period_id, user_id, units, method, route, model, feature, feature_day,
                              request_id, outcome, created_at, hold_micros, units_grant_id, cost_grant_id, rate_minute,
                              rate_tokens, rate_scopes, units_grant_part, cost_grant_part)
    OVERRIDING SYSTEM VALUE
    SELECT o.ledger, c.company, c.period, c.user_id, c.units, c.method, c.route, c.model, c.feature, o.fday,
           c.request_id, 'charged', c.at, CASE WHEN c.units > 0 THEN c.hold END, o.gu, o.gc, o.rmin, o.rtok, o.rscopes,
           o.gup, o.gcp
      FROM unnest(p_calls) WITH ORDINALITY c JOIN unnest(p_outcomes) WITH ORDINALITY o ON o.ordinality = c.ordinality
     WHERE o.decision = 'charged';
END;
$$;
