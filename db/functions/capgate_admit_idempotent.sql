-- A call with an Idempotency-Key: the API key (p_key_hash, or NULL when p_company and p_user
-- come from a verified JWT), the key's claim, and the admission, in one transaction and one
-- round trip. Decisions beyond capgate_admit's: idempotency_replay (answer_* hold the stored
-- answer), idempotency_in_flight, idempotency_not_kept, idempotency_mismatch. A key bound to
-- features (api_keys.features) is charged only to those, as in capgate_admit.
CREATE FUNCTION capgate_admit_idempotent(
    p_key_hash bytea, p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_fingerprint bytea, p_routes_version bigint,
    p_at timestamptz, p_relaxed boolean,
    p_prompt bigint, p_max_tokens bigint, p_cache smallint, p_window bigint
) RETURNS SETOF capgate_admitted
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_company uuid;
    v_user uuid;
    v_role text;
    v_auth text;
    v_bound text[];
    v_claim text;          -- new | retry (after a failure) | expired (older than the lifetime)
    k idempotency_keys%ROWTYPE;
    r capgate_admitted;
BEGIN
    r.item := 1;
    IF p_key_hash IS NOT NULL THEN
        SELECT ak.company_id, ak.user_id, u.role, ak.features,
               capgate_key_check(true, ak.revoked_at, ak.expires_at, u.disabled, p_at)
          INTO v_company, v_user, v_role, v_bound, v_auth
          FROM api_keys ak JOIN users u ON u.company_id = ak.company_id AND u.id = ak.user_id
         WHERE ak.key_hash = p_key_hash;
        IF NOT FOUND THEN
            v_auth := capgate_key_check(false, NULL, NULL, NULL, p_at);
        END IF;
        IF v_auth <> 'ok' THEN
            r.auth := v_auth;
            RETURN NEXT r;
            RETURN;
        END IF;
    ELSE
        v_company := p_company;
        v_user := p_user;
        SELECT u.role INTO v_role FROM users u WHERE u.company_id = p_company AND u.id = p_user;
    END IF;
    r.auth := 'ok';
    r.company_id := v_company;
    r.user_id := v_user;
    r.role := v_role;
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
            r.decision := 'idempotency_mismatch';
        ELSIF k.state = 'in_flight' THEN
            r.decision := 'idempotency_in_flight';
        ELSIF k.state = 'succeeded' AND k.response_kept THEN
            r.decision := 'idempotency_replay';
            r.answer_status := k.response_status;
            r.answer_type := k.response_type;
            r.answer_body := k.response_body;
        ELSIF k.state = 'succeeded' THEN
            r.decision := 'idempotency_not_kept';
        ELSE
            v_claim := 'retry';
        END IF;
        IF r.decision IS NOT NULL THEN
            RETURN NEXT r;
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

    r := capgate_with_offer(capgate_charge(v_company, v_user, p_units, p_method, p_route, p_model, p_feature,
                                           p_request_id, p_routes_version, p_at, v_bound, p_prompt, p_max_tokens,
                                           p_cache, p_window));
    r.role := v_role;
    IF r.decision = 'charged' THEN
        -- The row capgate_charge just wrote, created_at p_at: the time finds its month's partition.
        UPDATE usage_ledger l SET idempotency_key = p_idempotency_key
         WHERE l.company_id = v_company AND l.id = r.ledger_id AND l.created_at = p_at;
    ELSIF v_claim = 'retry' THEN
        -- Refused: the key stays as it was (its last attempt failed).
        UPDATE idempotency_keys ik SET state = 'failed'
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key;
    ELSE
        DELETE FROM idempotency_keys ik
         WHERE ik.company_id = v_company AND ik.user_id = v_user AND ik.key = p_idempotency_key;
    END IF;
    RETURN NEXT r;
END;
$$;

