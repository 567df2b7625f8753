-- One call without an Idempotency-Key, in one transaction and one round trip: the API key
-- (p_key_hash, its SHA-256) is looked up and its user admitted, or, with p_key_hash NULL, the
-- verified token's p_company and p_user are. p_relaxed: commit with synchronous_commit = off
-- (database.durability = relaxed). p_prompt, p_max_tokens, p_cache, p_window: the call's cost
-- bound (capgate_hold). The admission itself is capgate_charge; a key bound to
-- features (api_keys.features) is charged only to those (feature_not_bound for another).
-- p_ended: as capgate_admit_batch's.
CREATE FUNCTION capgate_admit(
    p_key_hash bytea, p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_routes_version bigint, p_at timestamptz, p_relaxed boolean,
    p_prompt bigint, p_max_tokens bigint, p_cache smallint, p_window bigint,
    p_ended bigint[] DEFAULT '{}'
) RETURNS SETOF capgate_admitted
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    r capgate_admitted;
    v_auth text;
    v_role text;
    v_bound text[];
BEGIN
    IF p_key_hash IS NOT NULL THEN
        SELECT k.company_id, k.user_id, u.role, k.features,
               capgate_key_check(true, k.revoked_at, k.expires_at, u.disabled, p_at)
          INTO p_company, p_user, v_role, v_bound, v_auth
          FROM api_keys k JOIN users u ON u.company_id = k.company_id AND u.id = k.user_id
         WHERE k.key_hash = p_key_hash;
        IF NOT FOUND THEN
            v_auth := capgate_key_check(false, NULL, NULL, NULL, p_at);
        END IF;
        IF v_auth <> 'ok' THEN
            r.item := 1;
            r.auth := v_auth;
            RETURN NEXT r;
            RETURN;
        END IF;
    END IF;
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    r := capgate_with_offer(capgate_charge(p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                                           p_request_id, p_routes_version, p_at, v_bound, p_prompt, p_max_tokens,
                                           p_cache, p_window, p_ended));
    r.role := v_role;
    RETURN NEXT r;
END;
$$;
