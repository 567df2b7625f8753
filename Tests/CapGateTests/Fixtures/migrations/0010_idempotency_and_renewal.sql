-- Idempotency-Key as SPEC §2 states it now, and periods that renew inside the admission.
--
-- 1. Idempotency-Key. Until now a retry with the same key was forwarded again and never charged
--    again: one header bought unlimited calls. Now a key belongs to the user who sent it and to
--    the exact request (a fingerprint of method, path, query and the body's SHA-256), and a
--    retry never reaches the provider a second time for one charge:
--      - the first attempt claims the key (idempotency_keys row, state in_flight) in the
--        admission transaction, before any counter is locked, and is charged as usual;
--      - another attempt while it is in flight: idempotency_in_flight (409);
--      - after it succeeded: its stored answer is returned (idempotency_replay), nothing is
--        forwarded or charged; an answer too large to keep: idempotency_not_kept (409);
--      - after it failed (its charge refunded, state failed): a new attempt, charged as usual;
--      - another request under the same key: idempotency_mismatch (422);
--      - a key older than 24 hours is forgotten (capgate_idempotency_purge deletes it; until
--        then the admission treats it as absent).
--    Lock order for a call with a key: its idempotency_keys row, then the period, the company
--    counter and the user counter as everywhere. capgate_refund takes the row in the same
--    order. Calls with a key run this function alone (they are not batched).
--    The ledger's old unique index (one charge per key, company and period) does not hold any
--    more: two users may send the same key, and a key forgotten after 24 hours may come back.
--    Ledger rows written before keep their meaning; usage_ledger_attempts (0009) stays for them.
--
-- 2. Renewal without a gap (SPEC §6). A call that finds no period containing its time moves its
--    company into that period first, in the same transaction, with capgate_roll_company (0003,
--    the same function `capgate rollover` runs: anchored, clamped, auto-renew keeps the plan,
--    otherwise the default plan). capgate_roll_company locks the company row first, so
--    concurrent calls at the boundary open one period: the later ones find it.

DROP INDEX usage_ledger_idempotency;
CREATE INDEX usage_ledger_idempotency ON usage_ledger (company_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE idempotency_keys (
    company_id uuid NOT NULL,
    user_id uuid NOT NULL,
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint bytea NOT NULL,                 -- SHA-256 of method, path and query, body SHA-256
    state text NOT NULL CHECK (state IN ('in_flight', 'succeeded', 'failed')),
    request_id text NOT NULL,                   -- the attempt that holds the key now
    response_status integer,
    response_type text,
    response_body bytea CHECK (octet_length(response_body) <= 67108864),
    response_kept boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT idempotency_keys_pkey PRIMARY KEY (company_id, user_id, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- How long a key is remembered.
CREATE FUNCTION capgate_idempotency_lifetime() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '24 hours' $$;

-- Single-call admission (0007's fast path), restated whole with the renewal: a call that finds
-- no period containing p_at first moves its company into that period.
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

    IF NOT FOUND THEN
        -- The period ended (or none was ever started): renew as the rollover would, then take
        -- the locking path below, which reads the period again.
        PERFORM capgate_roll_company(p_company, p_at);
        PERFORM 1 FROM plan_periods
         WHERE company_id = p_company AND started_at <= p_at AND ends_at > p_at
           FOR KEY SHARE;
    ELSIF v_user_found AND p_idempotency_key IS NULL THEN
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

-- A call with an Idempotency-Key: the API key (p_key_hash, or NULL when p_company and p_user
-- come from a verified JWT), the key's claim, and the admission, in one transaction and one
-- round trip. Decisions beyond capgate_admit's: idempotency_replay (answer_* hold the stored
-- answer), idempotency_in_flight, idempotency_not_kept, idempotency_mismatch.
CREATE FUNCTION capgate_admit_idempotent(
    p_key_hash bytea, p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_fingerprint bytea, p_at timestamptz,
    p_relaxed boolean
) RETURNS TABLE (
    auth text, company_id uuid, user_id uuid, role text,
    decision text, ledger_id bigint, period_id bigint, plan_id text, plan_name text,
    period_start timestamptz, period_end timestamptz, company_used bigint, company_cap bigint,
    user_used bigint, user_cap bigint, answer_status integer, answer_type text, answer_body bytea
)
LANGUAGE plpgsql AS $$
DECLARE
    v_company uuid;
    v_user uuid;
    v_role text;
    v_revoked boolean;
    v_disabled boolean;
    v_claim text;          -- new | retry (after a failure) | expired (older than the lifetime)
    k idempotency_keys%ROWTYPE;
    a capgate_admission;
BEGIN
    IF p_key_hash IS NOT NULL THEN
        SELECT ak.company_id, ak.user_id, u.role, ak.revoked_at IS NOT NULL, u.disabled
          INTO v_company, v_user, v_role, v_revoked, v_disabled
          FROM api_keys ak JOIN users u ON u.company_id = ak.company_id AND u.id = ak.user_id
         WHERE ak.key_hash = p_key_hash;
        IF NOT FOUND THEN
            auth := 'unknown_key';
        ELSIF v_revoked THEN
            auth := 'revoked_key';
        ELSIF v_disabled THEN
            auth := 'disabled_user';
        END IF;
        IF auth IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
    ELSE
        v_company := p_company;
        v_user := p_user;
        SELECT u.role INTO v_role FROM users u WHERE u.company_id = p_company AND u.id = p_user;
    END IF;
    auth := 'ok';
    company_id := v_company;
    user_id := v_user;
    role := v_role;
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    -- Claim the key. A concurrent first attempt's uncommitted claim makes this wait for its
    -- transaction; the row is then read as it committed.
    INSERT INTO idempotency_keys AS ik (company_id, user_id, key, fingerprint, state, request_id, created_at)
    VALUES (v_company, v_user, p_idempotency_key, p_fingerprint, 'in_flight', p_request_id, p_at)
    ON CONFLICT ON CONSTRAINT idempotency_keys_pkey DO NOTHING;
    IF FOUND THEN
        v_claim := 'new';
    ELSE
        SELECT * INTO k FROM idempotency_keys ik
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key
           FOR UPDATE;
        IF NOT FOUND THEN
            -- Purged between the two statements: claim it anew.
            INSERT INTO idempotency_keys (company_id, user_id, key, fingerprint, state, request_id, created_at)
            VALUES (v_company, v_user, p_idempotency_key, p_fingerprint, 'in_flight', p_request_id, p_at);
            v_claim := 'new';
        ELSIF k.created_at <= p_at - capgate_idempotency_lifetime() THEN
            v_claim := 'expired';
        ELSIF k.fingerprint <> p_fingerprint THEN
            decision := 'idempotency_mismatch';
        ELSIF k.state = 'in_flight' THEN
            decision := 'idempotency_in_flight';
        ELSIF k.state = 'succeeded' AND k.response_kept THEN
            decision := 'idempotency_replay';
            answer_status := k.response_status;
            answer_type := k.response_type;
            answer_body := k.response_body;
        ELSIF k.state = 'succeeded' THEN
            decision := 'idempotency_not_kept';
        ELSE
            v_claim := 'retry';
        END IF;
        IF decision IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF v_claim <> 'new' THEN
        UPDATE idempotency_keys ik
           SET fingerprint = p_fingerprint, state = 'in_flight', request_id = p_request_id,
               response_status = NULL, response_type = NULL, response_body = NULL, response_kept = false,
               created_at = CASE WHEN v_claim = 'expired' THEN p_at ELSE ik.created_at END,
               updated_at = clock_timestamp()
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key;
    END IF;

    a := capgate_admit(v_company, v_user, p_units, p_method, p_route, p_model, p_feature, p_request_id, NULL, p_at);
    IF a.decision = 'charged' THEN
        UPDATE usage_ledger l SET idempotency_key = p_idempotency_key
         WHERE l.company_id = v_company AND l.id = a.ledger_id;
    ELSIF v_claim = 'retry' THEN
        -- Refused: the key stays as it was (its last attempt failed).
        UPDATE idempotency_keys ik SET state = 'failed'
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key;
    ELSE
        DELETE FROM idempotency_keys ik
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key;
    END IF;
    decision := a.decision; ledger_id := a.ledger_id; period_id := a.period_id;
    plan_id := a.plan_id; plan_name := a.plan_name; period_start := a.period_start;
    period_end := a.period_end; company_used := a.company_used; company_cap := a.company_cap;
    user_used := a.user_used; user_cap := a.user_cap;
    RETURN NEXT;
END;
$$;

-- The answer of an attempt that succeeded (2xx), kept for retries; p_body NULL: too large to
-- keep (a retry gets idempotency_not_kept). Only the attempt holding the key records it.
CREATE FUNCTION capgate_idempotency_answer(
    p_company uuid, p_user uuid, p_key text, p_request_id text, p_status integer, p_type text, p_body bytea
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
       SET state = 'succeeded', response_status = p_status, response_type = p_type, response_body = p_body,
           response_kept = p_body IS NOT NULL, updated_at = clock_timestamp()
     WHERE company_id = p_company AND user_id = p_user AND key = p_key AND request_id = p_request_id
       AND state = 'in_flight';
    RETURN FOUND;
END;
$$;

-- Forgets keys older than their lifetime, at most p_limit rows per call (the purge job calls it
-- until it returns fewer).
CREATE FUNCTION capgate_idempotency_purge(p_at timestamptz, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM idempotency_keys ik
     WHERE (ik.company_id, ik.user_id, ik.key) IN (
            SELECT o.company_id, o.user_id, o.key FROM idempotency_keys o
             WHERE o.created_at <= p_at - capgate_idempotency_lifetime()
             ORDER BY o.created_at LIMIT p_limit
               FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

-- Refunds (0009's function, restated whole): an attempt with an Idempotency-Key that failed
-- marks its key failed first (lock order: key, company counter, ledger row, user counter), so a
-- retry is a new attempt.
CREATE OR REPLACE FUNCTION capgate_refund(p_company uuid, p_ledger_id bigint, p_upstream_status integer,
                                          p_request_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_period bigint;
    v_user uuid;
    v_units integer;
    v_outcome text;
    v_request text;
    v_key text;
BEGIN
    SELECT period_id, user_id, idempotency_key, request_id INTO v_period, v_user, v_key, v_request
      FROM usage_ledger WHERE company_id = p_company AND id = p_ledger_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_key IS NOT NULL THEN
        UPDATE idempotency_keys SET state = 'failed', updated_at = clock_timestamp()
         WHERE company_id = p_company AND user_id = v_user AND key = v_key AND request_id = v_request
           AND state = 'in_flight';
    END IF;
    PERFORM 1 FROM company_usage WHERE company_id = p_company AND period_id = v_period FOR UPDATE;
    SELECT user_id, units, outcome, request_id INTO v_user, v_units, v_outcome, v_request FROM usage_ledger
     WHERE company_id = p_company AND id = p_ledger_id FOR UPDATE;
    IF v_outcome <> 'charged' THEN
        RETURN false;
    END IF;
    -- Charges replayed under 0009's rules (ledger rows written before this migration) stand
    -- until every attempt at them failed.
    IF EXISTS (SELECT 1 FROM usage_ledger_attempts WHERE company_id = p_company AND ledger_id = p_ledger_id) THEN
        INSERT INTO usage_ledger_attempts (company_id, ledger_id, request_id, failed)
        VALUES (p_company, p_ledger_id, coalesce(p_request_id, v_request), true)
        ON CONFLICT (company_id, ledger_id, request_id) DO UPDATE SET failed = true;
        IF EXISTS (SELECT 1 FROM usage_ledger_attempts
                    WHERE company_id = p_company AND ledger_id = p_ledger_id AND NOT failed)
           OR NOT EXISTS (SELECT 1 FROM usage_ledger_attempts
                           WHERE company_id = p_company AND ledger_id = p_ledger_id AND request_id = v_request) THEN
            RETURN false;
        END IF;
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

-- Batches: 0009's function runs first; calls it answered no_active_plan (their company's period
-- ended, or none was ever started) have their companies renewed, in company order, and are
-- admitted again. Those calls changed nothing the first time, and the others keep their
-- decisions. Calls with an Idempotency-Key are never batched.
ALTER FUNCTION capgate_admit_batch(bytea[], uuid[], uuid[], integer[], text[], text[], text[], text[], text[], text[],
                                   timestamptz[], boolean)
    RENAME TO capgate_admit_batch_0009;

CREATE TYPE capgate_batch_row AS (
    item integer, auth text, company uuid, member uuid, member_role text,
    decision text, ledger bigint, period bigint, plan text, plan_name text,
    period_start timestamptz, period_end timestamptz, company_used bigint, company_cap bigint,
    user_used bigint, user_cap bigint
);

CREATE FUNCTION capgate_admit_batch(
    p_key_hash bytea[], p_company uuid[], p_user uuid[], p_units integer[], p_method text[], p_route text[],
    p_model text[], p_feature text[], p_request_id text[], p_idempotency_key text[], p_at timestamptz[],
    p_relaxed boolean
) RETURNS SETOF capgate_batch_row
LANGUAGE plpgsql AS $$
DECLARE
    v_rows capgate_batch_row[];
    v_again capgate_batch_row[];
    v_row capgate_batch_row;
    v_gaps integer[];
    v_company uuid;
    v_at timestamptz;
BEGIN
    v_rows := ARRAY(SELECT ROW(b.*)::capgate_batch_row
                      FROM capgate_admit_batch_0009(p_key_hash, p_company, p_user, p_units, p_method, p_route, p_model,
                                                    p_feature, p_request_id, p_idempotency_key, p_at, p_relaxed) b
                     ORDER BY b.item);
    SELECT array_agg(r.item ORDER BY r.item) INTO v_gaps FROM unnest(v_rows) r WHERE r.decision = 'no_active_plan';
    IF v_gaps IS NOT NULL THEN
        FOR v_company, v_at IN
            SELECT r.company, max(p_at[r.item]) FROM unnest(v_rows) r
             WHERE r.item = ANY (v_gaps) GROUP BY r.company ORDER BY r.company
        LOOP
            PERFORM capgate_roll_company(v_company, v_at);
        END LOOP;
        v_again := ARRAY(
            SELECT ROW(b.*)::capgate_batch_row
              FROM capgate_admit_batch_0009(
                       ARRAY(SELECT p_key_hash[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_company[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_user[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_units[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_method[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_route[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_model[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_feature[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_request_id[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_idempotency_key[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       ARRAY(SELECT p_at[g] FROM unnest(v_gaps) WITH ORDINALITY t(g, o) ORDER BY o),
                       p_relaxed) b
             ORDER BY b.item);
        FOR k IN 1..cardinality(v_gaps) LOOP
            v_row := v_again[k];
            v_row.item := v_gaps[k];
            v_rows[v_gaps[k]] := v_row;
        END LOOP;
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END;
$$;
