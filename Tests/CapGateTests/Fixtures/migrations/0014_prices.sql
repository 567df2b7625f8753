-- The price book (SPEC §11): what the provider bills per million tokens, by model and from when.
-- A table only: `capgate_price` (db/functions/capgate_price.sql) picks the row in force.
--
-- model: an exact model id, or a prefix ending in `*` (the only `*`); printable ASCII without
-- spaces. Money is integer micro-dollars (USD × 10^6) per million tokens, never floating point:
-- "3.75" USD per million tokens is 3750000. Rates are at most 10,000 USD per million tokens
-- (10^10) and windows at most 10^8 tokens, so tokens × rate stays below 10^18 and fits a bigint.
-- The long-prompt tier (every token of a request whose prompt is over long_prompt_threshold
-- tokens at these rates) is all null or all set.
--
-- The primary key's index (model, effective_from) is what `capgate_price` reads: one index
-- probe per candidate pattern of a model id.
CREATE TABLE prices (
    model text NOT NULL
        CHECK (model ~ '^[!-~]{1,200}$' AND position('*' IN model) IN (0, length(model))),
    effective_from timestamptz NOT NULL,
    context_window integer NOT NULL CHECK (context_window BETWEEN 1 AND 100000000),
    input bigint NOT NULL CHECK (input BETWEEN 0 AND 10000000000),
    output bigint NOT NULL CHECK (output BETWEEN 0 AND 10000000000),
    cache_write_5m bigint NOT NULL CHECK (cache_write_5m BETWEEN 0 AND 10000000000),
    cache_write_1h bigint NOT NULL CHECK (cache_write_1h BETWEEN 0 AND 10000000000),
    cache_read bigint NOT NULL CHECK (cache_read BETWEEN 0 AND 10000000000),
    long_prompt_threshold integer CHECK (long_prompt_threshold BETWEEN 1 AND 100000000),
    long_prompt_input bigint CHECK (long_prompt_input BETWEEN 0 AND 10000000000),
    long_prompt_output bigint CHECK (long_prompt_output BETWEEN 0 AND 10000000000),
    long_prompt_cache_write_5m bigint CHECK (long_prompt_cache_write_5m BETWEEN 0 AND 10000000000),
    long_prompt_cache_write_1h bigint CHECK (long_prompt_cache_write_1h BETWEEN 0 AND 10000000000),
    long_prompt_cache_read bigint CHECK (long_prompt_cache_read BETWEEN 0 AND 10000000000),
    CHECK (num_nulls(long_prompt_threshold, long_prompt_input, long_prompt_output, long_prompt_cache_write_5m,
                     long_prompt_cache_write_1h, long_prompt_cache_read) IN (0, 6)),
    CHECK (long_prompt_threshold < context_window),
    PRIMARY KEY (model, effective_from)
);
