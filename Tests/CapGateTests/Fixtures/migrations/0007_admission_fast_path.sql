-- The single-call admission in fewer statements and fewer row versions.
--
-- capgate_admit ran nine statements for a charged call: lock the period (0005's wrapper), read
-- the period, read the user, lock the company counter (SELECT ... FOR UPDATE), lock the user
-- counter, update both, insert the ledger row. Locking a row and then updating it writes the
-- row twice (the lock is recorded in the tuple and in the WAL). Now:
--   1. one statement reads the period containing p_at with its caps, locks it FOR KEY SHARE (as
--      0005 requires, before any counter), and reads the user;
--   2. the company counter is charged by a conditional UPDATE that takes its row lock and
--      re-checks the cap against the latest committed value (the cap can never be passed, under
--      any concurrency), then the user counter the same way: lock order company, then user, as
--      everywhere;
--   3. the ledger row is inserted.
-- Every other case takes 0002's locking path unchanged (capgate_admit_in_locked_period, the
-- period now locked): no period, an unknown user, a call with an Idempotency-Key (the retry
-- lookup must run under the company lock before anything is charged), and a conditional UPDATE
-- that changed nothing (a cap reached, or a counter row not yet created this period), after the
-- company charge is given back. That path creates the counter rows, locks company then user,
-- and says which cap was reached.

CREATE OR REPLACE FUNCTION capgate_admit(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_at timestamptz
) RETURNS capgate_admission
LANGUAGE plpgsql AS $$
DECLARE
    r capgate_admission;
    v_user_found boolean;
BEGIN
    SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at, pl.monthly_company_cap,
           coalesce(u.monthly_cap, pl.monthly_user_cap), u.id IS NOT NULL
      INTO r.period_id, r.plan_id, r.plan_name, r.period_start, r.period_end, r.company_cap, r.user_cap, v_user_found
      FROM plan_periods pp
      JOIN plans pl ON pl.id = pp.plan_id
      LEFT JOIN users u ON u.company_id = pp.company_id AND u.id = p_user AND NOT u.disabled
     WHERE pp.company_id = p_company AND pp.started_at <= p_at AND pp.ends_at > p_at
       FOR KEY SHARE OF pp;

    IF FOUND AND v_user_found AND p_idempotency_key IS NULL THEN
        UPDATE company_usage SET used = used + p_units
         WHERE company_id = p_company AND period_id = r.period_id
           AND (r.company_cap IS NULL OR used + p_units <= r.company_cap)
        RETURNING used INTO r.company_used;
        IF FOUND THEN
            UPDATE user_usage SET used = used + p_units
             WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user
               AND (r.user_cap IS NULL OR used + p_units <= r.user_cap)
            RETURNING used INTO r.user_used;
            IF FOUND THEN
                INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature,
                                          request_id, idempotency_key, outcome, created_at)
                VALUES (p_company, r.period_id, p_user, p_units, p_method, p_route, p_model, p_feature,
                        p_request_id, NULL, 'charged', p_at)
                RETURNING id INTO r.ledger_id;
                r.decision := 'charged';
                RETURN r;
            END IF;
            -- Give the company charge back (the row stays locked by this transaction).
            UPDATE company_usage SET used = used - p_units WHERE company_id = p_company AND period_id = r.period_id;
        END IF;
    END IF;

    RETURN capgate_admit_in_locked_period(p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                                          p_request_id, p_idempotency_key, p_at);
END;
$$;
