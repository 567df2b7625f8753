-- A call's hold (SPEC §11): its worst-case cost in micro-dollars, rounded up once; NULL when it
-- cannot be bounded (no price, p_prompt < -1, or no max_tokens: p_max_tokens < 0).
--
-- p_prompt: the prompt bound in tokens before the window caps it (the body's bytes plus
--   costs.promptOverheadTokens plus costs.imageTokens per image), -1 for "the whole window" (a
--   document block), -2 for a body the price book cannot bound (server tools, a batch).
-- p_cache: 0 no cache_control, 1 some (5-minute writes), 2 some asking for an hour.
-- p_window: the larger context window the request enables (a beta header), else 0.
-- The prompt is at most the window (the provider refuses longer prompts), and so is the output
-- (the provider refuses a max_tokens above the model's output limit, which is within its window).
-- The rate is the highest input-side rate that can apply (input, cache reads, the cache writes
-- the body can ask for), of the long-prompt tier when the prompt bound is over its threshold.
-- Worked in numeric: tokens (≤ 10^8) × rates (≤ 10^10) need no overflow care.
--
-- PL/pgSQL, not SQL: a SQL function with a query cannot be inlined, and called from the
-- admission it was planned again in every transaction; these are simple expressions, which
-- PL/pgSQL evaluates without the planner once the function is compiled in the session.
CREATE FUNCTION capgate_hold(p prices, p_prompt bigint, p_max_tokens bigint, p_cache smallint, p_window bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    w bigint;
    prompt bigint;
    rate bigint;
    output bigint;
BEGIN
    IF p.model IS NULL OR p_prompt < -1 OR p_max_tokens IS NULL OR p_max_tokens < 0 THEN
        RETURN NULL;
    END IF;
    w := greatest(p.context_window, p_window);
    prompt := CASE WHEN p_prompt = -1 THEN w ELSE least(p_prompt, w) END;
    IF p.long_prompt_threshold IS NOT NULL AND prompt > p.long_prompt_threshold THEN
        rate := greatest(p.long_prompt_input, p.long_prompt_cache_read,
                         CASE WHEN p_cache >= 1 THEN p.long_prompt_cache_write_5m END,
                         CASE WHEN p_cache >= 2 THEN p.long_prompt_cache_write_1h END);
        output := p.long_prompt_output;
    ELSE
        rate := greatest(p.input, p.cache_read, CASE WHEN p_cache >= 1 THEN p.cache_write_5m END,
                         CASE WHEN p_cache >= 2 THEN p.cache_write_1h END);
        output := p.output;
    END IF;
    RETURN ceil((prompt::numeric * rate + least(p_max_tokens, w)::numeric * output) / 1000000)::bigint;
END;
$$;
