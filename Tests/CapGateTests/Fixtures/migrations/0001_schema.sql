-- CapGate schema.
--
-- Every hot table (users, api_keys, plan_periods, company_usage, user_usage, usage_ledger,
-- billing_events) is keyed by company_id first: its primary key and indexes lead with
-- company_id and every hot-path query filters on it. The schema can therefore be distributed
-- by company (Citus: create_distributed_table(..., 'company_id'), with plans and products as
-- reference tables) without a redesign.

-- btree_gist lets the exclusion constraint below compare company_id with `=`.
CREATE EXTENSION IF NOT EXISTS btree_gist;

-- Plans are configuration rows: a cap change takes effect on the next request.
CREATE TABLE plans (
    id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    monthly_company_cap bigint CHECK (monthly_company_cap >= 0), -- NULL = unlimited
    monthly_user_cap bigint CHECK (monthly_user_cap >= 0),       -- NULL = unlimited
    price numeric(14, 2) NOT NULL DEFAULT 0 CHECK (price >= 0),
    currency text NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    is_default boolean NOT NULL DEFAULT false,
    is_active boolean NOT NULL DEFAULT true,
    sort_order integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- At most one default plan.
CREATE UNIQUE INDEX plans_single_default ON plans (is_default) WHERE is_default;

-- Store products map to plans by exact id, never by substring.
CREATE TABLE products (
    product_id text PRIMARY KEY CHECK (length(product_id) BETWEEN 1 AND 200),
    plan_id text NOT NULL REFERENCES plans (id),
    interval text NOT NULL CHECK (interval IN ('month', 'year')),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE companies (
    id uuid PRIMARY KEY,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    company_id uuid NOT NULL REFERENCES companies (id),
    id uuid NOT NULL UNIQUE,
    email text,
    role text NOT NULL DEFAULT 'member' CHECK (role IN ('member', 'admin')),
    monthly_cap bigint CHECK (monthly_cap >= 0), -- overrides the plan's per-user cap
    disabled boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, id)
);

-- Only the SHA-256 of a key is stored; `prefix` is the short visible part.
CREATE TABLE api_keys (
    company_id uuid NOT NULL,
    id uuid NOT NULL UNIQUE,
    user_id uuid NOT NULL,
    prefix text NOT NULL,
    key_hash bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    PRIMARY KEY (company_id, id),
    FOREIGN KEY (company_id, user_id) REFERENCES users (company_id, id)
);

-- A company's plan windows [started_at, ends_at), half-open, never overlapping.
CREATE TABLE plan_periods (
    company_id uuid NOT NULL REFERENCES companies (id),
    id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    plan_id text NOT NULL REFERENCES plans (id),
    started_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL,
    anchor timestamptz NOT NULL,          -- bounds are anchor + k intervals, clamped to month end
    interval text NOT NULL DEFAULT 'month' CHECK (interval IN ('month', 'year')),
    auto_renew boolean NOT NULL DEFAULT true,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled', 'expired', 'superseded')),
    source text NOT NULL DEFAULT 'operator',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (company_id, id),
    CHECK (ends_at > started_at),
    EXCLUDE USING gist (company_id WITH =, tstzrange(started_at, ends_at, '[)') WITH &&)
);

-- Usage counters, one row per company and period, and per user and period.
CREATE TABLE company_usage (
    company_id uuid NOT NULL,
    period_id bigint NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (company_id, period_id),
    FOREIGN KEY (company_id, period_id) REFERENCES plan_periods (company_id, id)
);

CREATE TABLE user_usage (
    company_id uuid NOT NULL,
    period_id bigint NOT NULL,
    user_id uuid NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (company_id, period_id, user_id),
    FOREIGN KEY (company_id, period_id) REFERENCES plan_periods (company_id, id)
);

-- The ledger: one row per admitted call. Rows are only ever appended, then settled once
-- (tokens and upstream status) or marked refunded; counters always equal the charged rows.
CREATE TABLE usage_ledger (
    company_id uuid NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    period_id bigint NOT NULL,
    user_id uuid NOT NULL,
    units integer NOT NULL CHECK (units > 0),
    input_tokens bigint,
    output_tokens bigint,
    method text NOT NULL,
    route text NOT NULL,
    model text,
    feature text,
    request_id text NOT NULL,
    idempotency_key text,
    outcome text NOT NULL CHECK (outcome IN ('charged', 'refunded')),
    upstream_status integer,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at timestamptz,
    PRIMARY KEY (company_id, id),
    FOREIGN KEY (company_id, period_id) REFERENCES plan_periods (company_id, id)
);
-- A retried Idempotency-Key is charged at most once per company and period.
CREATE UNIQUE INDEX usage_ledger_idempotency ON usage_ledger (company_id, period_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL AND outcome = 'charged';
CREATE INDEX usage_ledger_time ON usage_ledger (company_id, created_at, id);

-- Every store event and every change the billing job made, with its raw payload.
CREATE TABLE billing_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    company_id uuid,
    type text NOT NULL,
    transaction_id text UNIQUE,
    product_id text,
    plan_id text,
    payload jsonb NOT NULL DEFAULT '{}',
    result text,                          -- the answer given, repeated for a duplicate delivery
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX billing_events_company ON billing_events (company_id, created_at);
