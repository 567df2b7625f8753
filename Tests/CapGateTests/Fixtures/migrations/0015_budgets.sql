-- Cost budgets (SPEC §11): what a plan lets a company and each of its users spend per period,
-- the counters that hold it, and what each call was held and cost.
--
-- Money is integer micro-dollars (USD × 10^6), never floating point; NULL is unlimited.
-- A user's monthly_budget overrides the plan's monthly_user_budget, as monthly_cap does.
ALTER TABLE plans
    ADD COLUMN monthly_company_budget bigint CHECK (monthly_company_budget BETWEEN 0 AND 1000000000000000),
    ADD COLUMN monthly_user_budget bigint CHECK (monthly_user_budget BETWEEN 0 AND 1000000000000000);
ALTER TABLE users ADD COLUMN monthly_budget bigint CHECK (monthly_budget BETWEEN 0 AND 1000000000000000);

-- The period's counters gain its cost: cost_used (settled calls' costs) and cost_held (the holds
-- of calls admitted and not settled yet). A call is admitted only when used + held + its hold
-- fits the budget; settling replaces its hold by its cost in one transaction. `capgate verify`
-- recomputes both from the ledger: cost_used = the charged rows' cost_micros with a cost_source,
-- cost_held = the charged rows' hold_micros without one.
ALTER TABLE company_usage
    ADD COLUMN cost_used bigint NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    ADD COLUMN cost_held bigint NOT NULL DEFAULT 0 CHECK (cost_held >= 0);
ALTER TABLE user_usage
    ADD COLUMN cost_used bigint NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    ADD COLUMN cost_held bigint NOT NULL DEFAULT 0 CHECK (cost_held >= 0);

-- A call's tokens (input_tokens and output_tokens exist), its hold and its cost:
-- hold_micros: what admission reserved (NULL: nothing was held: no price, or no max_tokens where
--   no budget applies); cost_micros: what the settled call cost (NULL: not settled, or not priced);
-- cost_source: 'usage' (the provider's usage), 'hold' (usage unknown: charged its hold), NULL
--   while the hold is open (and for a call that was not priced).
ALTER TABLE usage_ledger
    ADD COLUMN cache_write_5m_tokens bigint,
    ADD COLUMN cache_write_1h_tokens bigint,
    ADD COLUMN cache_read_tokens bigint,
    ADD COLUMN hold_micros bigint CHECK (hold_micros >= 0),
    ADD COLUMN cost_micros bigint CHECK (cost_micros >= 0),
    ADD COLUMN cost_source text CHECK (cost_source IN ('usage', 'hold'));
