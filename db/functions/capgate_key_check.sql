-- Whether an API key may make a call at p_at (SPEC §3, §13): the one place the rule is written.
-- p_found: the key exists (with its user); p_revoked_at, p_expires_at: the key's; p_disabled:
-- its user's. Answers ok | unknown_key | revoked_key | expired_key | disabled_user, checked in
-- that order (a revoked key that has also expired is revoked). The admission functions and the
-- gateway's key cache (KnownKeys) all ask it; Swift reads the answer as KeyCheck.
-- A plain SQL expression, inlined where it is called from a query (no call per row).
CREATE FUNCTION capgate_key_check(
    p_found boolean, p_revoked_at timestamptz, p_expires_at timestamptz, p_disabled boolean, p_at timestamptz
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN NOT p_found THEN 'unknown_key'
                WHEN p_revoked_at IS NOT NULL THEN 'revoked_key'
                WHEN p_expires_at <= p_at THEN 'expired_key'
                WHEN p_disabled THEN 'disabled_user'
                ELSE 'ok' END
$$;
