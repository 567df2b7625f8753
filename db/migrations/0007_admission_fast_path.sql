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
-- When a conditional UPDATE changes nothing (a counter row not yet created this period, or a
-- cap reached) the company charge is given back and the call takes the locking path of
-- 0002 unchanged (create the counter rows, lock both, decide and say which cap). A call with an
-- Idempotency-Key always takes the locking path: the retry lookup must run under the company
-- lock before anything is charged.

CREATE OR REPLACE FUNCTION capgate_admit(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_at timestamptz
) RETURNS capgate_admission
LANGUAGE plpgsql AS $$
DECLARE
    r capgate_admission;
    v_user_found boolean;
    v_user_cap bigint;
BEGIN
    SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at, pl.monthly_company_cap, pl.monthly_user_cap,
           u.id IS NOT NULL, u.monthly_cap
      INTO r.period_id, r.plan_id, r.plan_name, r.period_start, r.period_end, r.company_cap, r.user_cap,
           v_user_found, v_user_cap
      FROM plan_periods pp
      JOIN plans pl ON pl.id = pp.plan_id
      LEFT JOIN users u ON u.company_id = pp.company_id AND u.id = p_user AND NOT u.disabled
     WHERE pp.company_id = p_company AND pp.started_at <= p_at AND pp.ends_at > p_at
       FOR KEY SHARE OF pp;
    IF NOT FOUND THEN
        r.decision := 'no_active_plan';
        RETURN r;
    END IF;
    IF NOT v_user_found THEN
        r.decision := 'unknown_user';
        RETURN r;
    END IF;
    r.user_cap := coalesce(v_user_cap, r.user_cap);

    IF p_idempotency_key IS NULL THEN
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
            -- Give the company charge back; the locking path decides (the row stays locked).
            UPDATE company_usage SET used = used - p_units WHERE company_id = p_company AND period_id = r.period_id;
        END IF;
    END IF;

    -- The locking path: create the counter rows if needed, lock company then user, decide.
    SELECT used INTO r.company_used FROM company_usage
     WHERE company_id = p_company AND period_id = r.period_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO company_usage (company_id, period_id, used) VALUES (p_company, r.period_id, 0)
            ON CONFLICT DO NOTHING;
        SELECT used INTO r.company_used FROM company_usage
         WHERE company_id = p_company AND period_id = r.period_id FOR UPDATE;
    END IF;
    SELECT used INTO r.user_used FROM user_usage
     WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO user_usage (company_id, period_id, user_id, used) VALUES (p_company, r.period_id, p_user, 0)
            ON CONFLICT DO NOTHING;
        SELECT used INTO r.user_used FROM user_usage
         WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user FOR UPDATE;
    END IF;

    -- A retry of a call already charged in this period is forwarded, never charged again.
    -- The company lock above serialises this check with the insert below.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT id INTO r.ledger_id FROM usage_ledger
         WHERE company_id = p_company AND period_id = r.period_id
           AND idempotency_key = p_idempotency_key AND outcome = 'charged';
        IF FOUND THEN
            r.decision := 'replayed';
            RETURN r;
        END IF;
    END IF;

    IF r.company_cap IS NOT NULL AND r.company_used + p_units > r.company_cap THEN
        r.decision := 'company_cap';
        RETURN r;
    END IF;
    IF r.user_cap IS NOT NULL AND r.user_used + p_units > r.user_cap THEN
        r.decision := 'user_cap';
        RETURN r;
    END IF;

    UPDATE company_usage SET used = used + p_units WHERE company_id = p_company AND period_id = r.period_id;
    UPDATE user_usage SET used = used + p_units
     WHERE company_id = p_company AND period_id = r.period_id AND user_id = p_user;
    r.company_used := r.company_used + p_units;
    r.user_used := r.user_used + p_units;

    INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, model, feature,
                              request_id, idempotency_key, outcome, created_at)
    VALUES (p_company, r.period_id, p_user, p_units, p_method, p_route, p_model, p_feature,
            p_request_id, p_idempotency_key, 'charged', p_at)
    RETURNING id INTO r.ledger_id;

    r.decision := 'charged';
    RETURN r;
END;
$$;

-- 0005's inner function is no longer called: capgate_admit locks its period itself.
DROP FUNCTION capgate_admit_in_locked_period(uuid, uuid, integer, text, text, text, text, text, text, timestamptz);
