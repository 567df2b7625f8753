-- Admission, refund and settlement: the metering hot path, one round trip each.
--
-- Lock order is always: company counter, then user counter. Every function that changes
-- counters follows it, so two transactions can never wait on each other in a cycle.

CREATE TYPE capgate_admission AS (
    decision text,        -- charged | replayed | company_cap | user_cap | no_active_plan | unknown_user
    ledger_id bigint,
    period_id bigint,
    plan_id text,
    plan_name text,
    period_start timestamptz,
    period_end timestamptz,
    company_used bigint,
    company_cap bigint,
    user_used bigint,
    user_cap bigint
);

-- Admits p_units for one user of one company at p_at, or changes nothing.
CREATE FUNCTION capgate_admit(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_at timestamptz
) RETURNS capgate_admission
LANGUAGE plpgsql AS $$
DECLARE
    r capgate_admission;
    v_user_found boolean;
BEGIN
    -- The period that contains p_at (half-open), with the caps as they are now.
    SELECT pp.id, pp.plan_id, pl.name, pp.started_at, pp.ends_at, pl.monthly_company_cap, pl.monthly_user_cap
      INTO r.period_id, r.plan_id, r.plan_name, r.period_start, r.period_end, r.company_cap, r.user_cap
      FROM plan_periods pp
      JOIN plans pl ON pl.id = pp.plan_id
     WHERE pp.company_id = p_company AND pp.started_at <= p_at AND pp.ends_at > p_at;
    IF NOT FOUND THEN
        r.decision := 'no_active_plan';
        RETURN r;
    END IF;

    SELECT true, COALESCE(u.monthly_cap, r.user_cap) INTO v_user_found, r.user_cap
      FROM users u WHERE u.company_id = p_company AND u.id = p_user AND NOT u.disabled;
    IF v_user_found IS NULL THEN
        r.decision := 'unknown_user';
        RETURN r;
    END IF;

    -- 1. company counter
    SELECT used INTO r.company_used FROM company_usage
     WHERE company_id = p_company AND period_id = r.period_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO company_usage (company_id, period_id, used) VALUES (p_company, r.period_id, 0)
            ON CONFLICT DO NOTHING;
        SELECT used INTO r.company_used FROM company_usage
         WHERE company_id = p_company AND period_id = r.period_id FOR UPDATE;
    END IF;

    -- 2. user counter
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

-- The same admission with `synchronous_commit = off` for its transaction (database.durability =
-- relaxed): the commit returns before the WAL reaches disk, so a database crash can lose the
-- last fraction of a second of admissions. Off by default.
CREATE FUNCTION capgate_admit_relaxed(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_at timestamptz
) RETURNS capgate_admission
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN capgate_admit(p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                         p_request_id, p_idempotency_key, p_at);
END;
$$;

-- Gives back a charge: counters decremented, ledger row marked refunded. Idempotent.
CREATE FUNCTION capgate_refund(p_company uuid, p_ledger_id bigint, p_upstream_status integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_period bigint;
    v_user uuid;
    v_units integer;
    v_outcome text;
BEGIN
    SELECT period_id INTO v_period FROM usage_ledger WHERE company_id = p_company AND id = p_ledger_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM company_usage WHERE company_id = p_company AND period_id = v_period FOR UPDATE;
    SELECT user_id, units, outcome INTO v_user, v_units, v_outcome FROM usage_ledger
     WHERE company_id = p_company AND id = p_ledger_id FOR UPDATE;
    IF v_outcome <> 'charged' THEN
        RETURN false;
    END IF;
    UPDATE company_usage SET used = used - v_units WHERE company_id = p_company AND period_id = v_period;
    UPDATE user_usage SET used = used - v_units
     WHERE company_id = p_company AND period_id = v_period AND user_id = v_user;
    UPDATE usage_ledger
       SET outcome = 'refunded', upstream_status = p_upstream_status, settled_at = clock_timestamp()
     WHERE company_id = p_company AND id = p_ledger_id;
    RETURN true;
END;
$$;

-- Records the provider's status and token counts on a charge that stands. The charge itself was
-- committed durably by the admission; this informational write commits without waiting for the
-- WAL flush (a database crash can lose token counts of the last instant, never a charge).
CREATE FUNCTION capgate_settle(p_company uuid, p_ledger_id bigint, p_upstream_status integer,
                               p_input_tokens bigint, p_output_tokens bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE usage_ledger
       SET upstream_status = p_upstream_status, input_tokens = p_input_tokens, output_tokens = p_output_tokens,
           settled_at = clock_timestamp()
     WHERE company_id = p_company AND id = p_ledger_id AND outcome = 'charged';
END;
$$;

-- Authentication by API key and admission in one round trip: the key's SHA-256 is looked up,
-- then capgate_admit (or capgate_admit_relaxed) runs for its user. `auth` is ok | unknown_key |
-- revoked_key | disabled_user; the admission columns are NULL unless auth is ok.
CREATE FUNCTION capgate_admit_key(
    p_key_hash bytea, p_units integer, p_method text, p_route text, p_model text, p_feature text,
    p_request_id text, p_idempotency_key text, p_at timestamptz, p_relaxed boolean
) RETURNS TABLE (
    auth text, company_id uuid, user_id uuid, role text,
    decision text, ledger_id bigint, period_id bigint, plan_id text, plan_name text,
    period_start timestamptz, period_end timestamptz, company_used bigint, company_cap bigint,
    user_used bigint, user_cap bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    v_revoked boolean;
    v_disabled boolean;
    a capgate_admission;
BEGIN
    SELECT k.company_id, k.user_id, u.role, k.revoked_at IS NOT NULL, u.disabled
      INTO company_id, user_id, role, v_revoked, v_disabled
      FROM api_keys k JOIN users u ON u.company_id = k.company_id AND u.id = k.user_id
     WHERE k.key_hash = p_key_hash;
    IF NOT FOUND THEN
        auth := 'unknown_key';
    ELSIF v_revoked THEN
        auth := 'revoked_key';
    ELSIF v_disabled THEN
        auth := 'disabled_user';
    ELSE
        auth := 'ok';
        IF p_relaxed THEN
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        a := capgate_admit(company_id, user_id, p_units, p_method, p_route, p_model, p_feature,
                           p_request_id, p_idempotency_key, p_at);
        decision := a.decision; ledger_id := a.ledger_id; period_id := a.period_id;
        plan_id := a.plan_id; plan_name := a.plan_name; period_start := a.period_start;
        period_end := a.period_end; company_used := a.company_used; company_cap := a.company_cap;
        user_used := a.user_used; user_cap := a.user_cap;
    END IF;
    RETURN NEXT;
END;
$$;
