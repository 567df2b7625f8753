-- The tokens a call holds in a token window (SPEC §14): its prompt bound plus its max_tokens, as
-- the cost hold bounds them (capgate_hold), each at most the context window when the model's is
-- known; NULL when it cannot be bounded (p_prompt < -1: a body the price book cannot bound;
-- p_max_tokens < 0: none given; p_prompt = -1, "the whole window", of a model with no price).
CREATE FUNCTION capgate_rate_tokens(p prices, p_prompt bigint, p_max_tokens bigint, p_window bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    w bigint := greatest(coalesce(p.context_window, 0), coalesce(p_window, 0));
BEGIN
    IF p_prompt IS NULL OR p_prompt < -1 OR p_max_tokens IS NULL OR p_max_tokens < 0 OR (p_prompt = -1 AND w = 0) THEN
        RETURN NULL;
    END IF;
    IF w = 0 THEN
        RETURN p_prompt + p_max_tokens;
    END IF;
    RETURN CASE WHEN p_prompt = -1 THEN w ELSE least(p_prompt, w) END + least(p_max_tokens, w);
END;
$$;
