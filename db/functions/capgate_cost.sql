-- What a call cost (SPEC §11), in micro-dollars rounded up once, from the provider's usage at
-- price p: every token at the long-prompt tier's rates when the prompt (input + cache writes +
-- cache reads) is over its threshold; NULL without a price. PL/pgSQL for the reason
-- capgate_hold gives.
CREATE FUNCTION capgate_cost(
    p prices, p_input bigint, p_cache_write_5m bigint, p_cache_write_1h bigint, p_cache_read bigint, p_output bigint
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF p.model IS NULL THEN
        RETURN NULL;
    ELSIF p.long_prompt_threshold IS NOT NULL
          AND p_input + p_cache_write_5m + p_cache_write_1h + p_cache_read > p.long_prompt_threshold THEN
        RETURN ceil((p_input::numeric * p.long_prompt_input + p_cache_write_5m::numeric * p.long_prompt_cache_write_5m
                     + p_cache_write_1h::numeric * p.long_prompt_cache_write_1h
                     + p_cache_read::numeric * p.long_prompt_cache_read + p_output::numeric * p.long_prompt_output)
                    / 1000000)::bigint;
    END IF;
    RETURN ceil((p_input::numeric * p.input + p_cache_write_5m::numeric * p.cache_write_5m
                 + p_cache_write_1h::numeric * p.cache_write_1h + p_cache_read::numeric * p.cache_read
                 + p_output::numeric * p.output) / 1000000)::bigint;
END;
$$;
