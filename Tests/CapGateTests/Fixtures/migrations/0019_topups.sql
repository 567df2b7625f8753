-- Top-up packs (SPEC §12 "Top-ups"): a store product of kind 'topup' grants units and/or a
-- budget to the company for valid_days; admission draws on the grants only for what the plan's
-- company cap or company budget cannot hold (capgate_grant_take).

-- A product is a subscription (mapped to a plan and an interval, as before) or a top-up (no
-- plan, no interval; units and/or budget_micros, valid for valid_days from its purchase).
ALTER TABLE products
    ALTER COLUMN plan_id DROP NOT NULL,
    ALTER COLUMN interval DROP NOT NULL,
    ADD COLUMN kind text NOT NULL DEFAULT 'subscription' CHECK (kind IN ('subscription', 'topup')),
    ADD COLUMN units bigint CHECK (units BETWEEN 1 AND 1000000000000000),
    ADD COLUMN budget_micros bigint CHECK (budget_micros BETWEEN 1 AND 1000000000000000),
    ADD COLUMN valid_days integer NOT NULL DEFAULT 365 CHECK (valid_days BETWEEN 1 AND 36600),
    ADD CONSTRAINT products_kind_fields CHECK (
        CASE kind
            WHEN 'subscription' THEN plan_id IS NOT NULL AND interval IS NOT NULL AND units IS NULL AND budget_micros IS NULL
            ELSE plan_id IS NULL AND interval IS NULL AND (units IS NOT NULL OR budget_micros IS NOT NULL)
        END);

-- What a top-up purchase granted a company, once per store transaction (transaction_id: the
-- purchase's original transaction id, Apple's or the one posted to /admin/v1/billing/events; a
-- second delivery of the same purchase finds it and grants nothing).
-- units / budget_micros: granted (NULL: the pack has none of it). units_used: the units of the
-- charged calls it paid. cost_used / cost_held: the settled costs and the open holds of the
-- charged calls whose cost it paid (micro-dollars). A refund of the pack sets refunded_at: what
-- is left of it is gone (nothing is drawn from it again); what was used stays used. A refund
-- that arrives before the purchase is recorded as a refunded grant, so the purchase, posted
-- later, grants nothing.
CREATE TABLE topup_grants (
    company_id uuid NOT NULL REFERENCES companies (id),
    id bigint GENERATED ALWAYS AS IDENTITY,
    product_id text NOT NULL REFERENCES products (product_id),
    transaction_id text NOT NULL UNIQUE CHECK (length(transaction_id) BETWEEN 1 AND 200),
    units bigint CHECK (units > 0),
    units_used bigint NOT NULL DEFAULT 0 CHECK (units_used >= 0),
    budget_micros bigint CHECK (budget_micros > 0),
    cost_used bigint NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    cost_held bigint NOT NULL DEFAULT 0 CHECK (cost_held >= 0),
    granted_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    refunded_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, id),
    CHECK (expires_at > granted_at),
    CHECK (units IS NOT NULL OR budget_micros IS NOT NULL)
);
-- The grants admission may draw on, in the order it draws (oldest expiry first): one index
-- probe answers "none" for a company without grants.
CREATE INDEX topup_grants_draw ON topup_grants (company_id, expires_at, id) WHERE refunded_at IS NULL;

-- Which grant paid a charged call: units_grant_id its units (the company counter did not count
-- them), cost_grant_id its hold and then its cost (the company's cost counters did not take
-- them). A refund gives back to these grants; settlement settles the cost grant's hold.
ALTER TABLE usage_ledger
    ADD COLUMN units_grant_id bigint,
    ADD COLUMN cost_grant_id bigint;
