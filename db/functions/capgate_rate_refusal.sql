-- Whether one more call holding p_add tokens fits a minute window that holds p_calls calls and
-- p_tokens tokens (SPEC §14): NULL when it fits, else the refusing window, '<p_who>-rpm' (p_rpm
-- calls; NULL: no limit) before '<p_who>-tpm' (p_tpm tokens). Shared by the windows kept in
-- rate_windows (capgate_rate_count) and in the period counters (capgate_rate_counter).
CREATE FUNCTION capgate_rate_refusal(p_calls bigint, p_tokens bigint, p_add bigint, p_rpm integer, p_tpm bigint, p_who text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_rpm IS NOT NULL AND p_calls + 1 > p_rpm THEN p_who || '-rpm'
                WHEN p_tpm IS NOT NULL AND p_tokens + p_add > p_tpm THEN p_who || '-tpm' END
$$;
