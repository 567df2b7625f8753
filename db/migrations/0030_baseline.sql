-- The baseline: the schema that migrations 0001 to 0029 made, in one file (issue #48 item 5).
-- Those files were mostly old bodies of functions that db/functions/ makes anyway; they are in
-- the git history (and in Tests/CapGateTests/Fixtures/migrations/, for the upgrade tests).
--
-- A new database runs this file. A database made by 0001 to 0029 does not: its schema is this one
-- (a test compares the two), so the migrator records this version as applied without running it.
-- A database at an older migration is refused: a build from before the baseline upgrades it to
-- 0029 first (docs/migrations.md).
--
-- Not here: the capgate_* functions and composite types (db/functions/, applied as a set after
-- the migrations), and the migrator's own tables capgate_migrations and capgate_functions. Here:
-- the tables, their keys, indexes and constraints, the views, the functions that are not in the
-- set (ledger_rollup_part, capgate_ledger_rollup), the triggers, and the one row of
-- config_versions.
--
-- Every hot table (users, api_keys, plan_periods, the usage counters, usage_ledger,
-- billing_events, ...) is keyed by company_id first: its primary key and indexes lead with
-- company_id and every hot-path query filters on it. The schema can therefore be distributed by
-- company (Citus: create_distributed_table(..., 'company_id'), with plans and products as
-- reference tables; docs/scale-out.md) without a redesign.
--
-- Money is integer micro-dollars (USD x 10^6), never floating point; a NULL limit is unlimited.

-- btree_gist lets plan_periods' exclusion constraint compare company_id with `=`.
CREATE EXTENSION IF NOT EXISTS btree_gist;


-- ---------------------------------------------------------------------------------------------
-- Plans, companies, users and their keys
-- ---------------------------------------------------------------------------------------------

-- Plans are configuration rows: a change takes effect on the next request. Caps are units per
-- period; budgets micro-dollars per period (a user's own cap and budget, on users, override the
-- plan's per-user ones). Rate windows (SPEC §14), per fixed UTC minute: company_rpm / user_rpm
-- (calls), company_tpm / user_tpm (tokens: held as the call's prompt bound plus max_tokens,
-- settled to the real count); user_concurrency: calls in flight at once.
CREATE TABLE plans (
    id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    monthly_company_cap bigint CHECK (monthly_company_cap >= 0),
    monthly_user_cap bigint CHECK (monthly_user_cap >= 0),
    price numeric(14, 2) NOT NULL DEFAULT 0 CHECK (price >= 0),
    currency text NOT NULL DEFAULT 'USD' CHECK (currency ~ '^[A-Z]{3}$'),
    is_default boolean NOT NULL DEFAULT false,
    is_active boolean NOT NULL DEFAULT true,
    sort_order integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    monthly_company_budget bigint CHECK (monthly_company_budget BETWEEN 0 AND 1000000000000000),
    monthly_user_budget bigint CHECK (monthly_user_budget BETWEEN 0 AND 1000000000000000),
    company_rpm integer CHECK (company_rpm BETWEEN 0 AND 1000000000),
    user_rpm integer CHECK (user_rpm BETWEEN 0 AND 1000000000),
    company_tpm bigint CHECK (company_tpm BETWEEN 0 AND 1000000000000),
    user_tpm bigint CHECK (user_tpm BETWEEN 0 AND 1000000000000),
    user_concurrency integer CHECK (user_concurrency BETWEEN 0 AND 1000000)
);
-- At most one default plan.
CREATE UNIQUE INDEX plans_single_default ON plans (is_default) WHERE is_default;

-- Store products map to plans by exact id, never by substring. A product is a subscription (a
-- plan and an interval) or a top-up (SPEC §12 "Top-ups": no plan, no interval; units and/or
-- budget_micros granted to the company for valid_days from its purchase; topup_grants below).
CREATE TABLE products (
    product_id text PRIMARY KEY CHECK (length(product_id) BETWEEN 1 AND 200),
    plan_id text REFERENCES plans (id),
    interval text CHECK (interval IN ('month', 'year')),
    created_at timestamptz NOT NULL DEFAULT now(),
    kind text NOT NULL DEFAULT 'subscription' CHECK (kind IN ('subscription', 'topup')),
    units bigint CHECK (units BETWEEN 1 AND 1000000000000000),
    budget_micros bigint CHECK (budget_micros BETWEEN 1 AND 1000000000000000),
    valid_days integer NOT NULL DEFAULT 365 CHECK (valid_days BETWEEN 1 AND 36600),
    CONSTRAINT products_kind_fields CHECK (
        CASE kind
            WHEN 'subscription' THEN plan_id IS NOT NULL AND interval IS NOT NULL AND units IS NULL AND budget_micros IS NULL
            ELSE plan_id IS NULL AND interval IS NULL AND (units IS NOT NULL OR budget_micros IS NOT NULL)
        END)
);

-- time_zone: days are midnight to midnight in the company's zone (an IANA name PostgreSQL knows).
-- webhook_url: where its threshold notifications go (else `notifications.webhookUrl`).
-- app_account_token: the appAccountToken an app sets on a purchase for this company (SPEC §12):
-- random, never the company id (which every member sees); the operator rotates it
-- (POST /admin/v1/companies/{id}/app-account-token) and the old one then matches nothing.
CREATE TABLE companies (
    id uuid PRIMARY KEY,
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at timestamptz NOT NULL DEFAULT now(),
    time_zone text NOT NULL DEFAULT 'UTC' CHECK (length(time_zone) BETWEEN 1 AND 64),
    webhook_url text CHECK (webhook_url ~ '^https?://[^[:space:]]+$' AND length(webhook_url) <= 2000),
    app_account_token uuid NOT NULL DEFAULT gen_random_uuid(),
    app_account_token_rotated_at timestamptz
);
CREATE UNIQUE INDEX companies_app_account_token ON companies (app_account_token);

-- A user id is unique within its company, not across companies (SPEC §5): the same identity-
-- provider id in two companies is two users, and no answer tells one company whether an id
-- exists in another. Every table that names a user does so with its company.
CREATE TABLE users (
    company_id uuid NOT NULL REFERENCES companies (id),
    id uuid NOT NULL,
    email text,
    role text NOT NULL DEFAULT 'member' CHECK (role IN ('member', 'admin')),
    monthly_cap bigint CHECK (monthly_cap >= 0),
    disabled boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now(),
    monthly_budget bigint CHECK (monthly_budget BETWEEN 0 AND 1000000000000000),
    PRIMARY KEY (company_id, id)
);

-- Only the SHA-256 of a key is stored; `prefix` is the short visible part. features: the
-- features the key may be charged to (NULL: any; SPEC §8). name: a label for people; expires_at:
-- when it stops working (NULL: never; a rotation sets the old key's); last_used_at: written by a
-- periodic flush, at most once a minute a key, never inside an admission.
CREATE TABLE api_keys (
    company_id uuid NOT NULL,
    id uuid NOT NULL UNIQUE,
    user_id uuid NOT NULL,
    prefix text NOT NULL,
    key_hash bytea NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz,
    features text[] CHECK (cardinality(features) <= 100 AND array_position(features, NULL) IS NULL),
    name text CHECK (char_length(name) <= 200),
    expires_at timestamptz,
    last_used_at timestamptz,
    PRIMARY KEY (company_id, id),
    FOREIGN KEY (company_id, user_id) REFERENCES users (company_id, id)
);


-- ---------------------------------------------------------------------------------------------
-- Plan periods and the usage counters
-- ---------------------------------------------------------------------------------------------

-- A company's plan windows [started_at, ends_at), half-open, never overlapping. Bounds are
-- anchor + k intervals, clamped to the month's end (capgate_period_bound). plan_origin: where the
-- period's plan came from, 'operator' (a company's creation, PUT .../plan) or 'store' (a store
-- event, and the default plan a refund or an expiry moved the company to); store_subscription:
-- the original transaction id of the store subscription whose event set the plan. A store
-- subscription replaces only the default plan or a 'store' one; a refund moves the company only
-- when its subscription set the running plan; the rollover's renewed period keeps both.
CREATE TABLE plan_periods (
    company_id uuid NOT NULL REFERENCES companies (id),
    id bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    plan_id text NOT NULL REFERENCES plans (id),
    started_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL,
    anchor timestamptz NOT NULL,
    interval text NOT NULL DEFAULT 'month' CHECK (interval IN ('month', 'year')),
    auto_renew boolean NOT NULL DEFAULT true,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'cancelled', 'expired', 'superseded')),
    source text NOT NULL DEFAULT 'operator',
    created_at timestamptz NOT NULL DEFAULT now(),
    plan_origin text NOT NULL DEFAULT 'operator' CHECK (plan_origin IN ('operator', 'store')),
    store_subscription text,
    PRIMARY KEY (company_id, id),
    CONSTRAINT plan_periods_check CHECK (ends_at > started_at),
    EXCLUDE USING gist (company_id WITH =, tstzrange(started_at, ends_at, '[)') WITH &&)
);

-- The counters, one row per company and period and per user and period. used: units;
-- cost_used: the settled calls' costs; cost_held: the holds of calls admitted and not settled
-- yet (a call is admitted only when used + held + its hold fits the budget; settling replaces
-- its hold by its cost in one transaction). rate_minute, rate_calls, rate_tokens: the plan's rate
-- window of the UTC minute rate_minute (NULL: never counted); a row on an earlier minute starts
-- again at zero with the call that finds it so, and a period that starts inside a minute starts
-- from the counts of the periods it follows in that minute (capgate_rate_carry). Every admission
-- locks and writes these rows anyway: the plan's windows live here, not in rate_windows, to save
-- two row locks and writes a call.
--
-- No foreign key to plan_periods (nor from usage_ledger): one RI query a row inserted or updated
-- was about half of an admission batch's time. What the keys guaranteed, no counter or ledger
-- row for a period that does not exist, holds by (1) every admission locking the periods it
-- charges against FOR KEY SHARE, once a period and before any counter (lock order: period,
-- company counter, user counter), and (2) the trigger below, which refuses to delete or re-key a
-- period that ledger rows reference and deletes its counter rows with it.
CREATE TABLE company_usage (
    company_id uuid NOT NULL,
    period_id bigint NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    cost_used bigint NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    cost_held bigint NOT NULL DEFAULT 0 CHECK (cost_held >= 0),
    rate_minute timestamptz,
    rate_calls bigint NOT NULL DEFAULT 0,
    rate_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (company_id, period_id)
);

CREATE TABLE user_usage (
    company_id uuid NOT NULL,
    period_id bigint NOT NULL,
    user_id uuid NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    cost_used bigint NOT NULL DEFAULT 0 CHECK (cost_used >= 0),
    cost_held bigint NOT NULL DEFAULT 0 CHECK (cost_held >= 0),
    rate_minute timestamptz,
    rate_calls bigint NOT NULL DEFAULT 0,
    rate_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (company_id, period_id, user_id)
);

-- The function's body is db/functions/capgate_keep_used_period.sql (CREATE OR REPLACE), applied
-- right after the migrations; this stand-in only lets the trigger be made here. A new database
-- holds no period before the function set has run.
CREATE FUNCTION capgate_keep_used_period() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'capgate_keep_used_period: db/functions/ not applied yet (run capgate migrate)';
END;
$$;

CREATE TRIGGER plan_periods_keep_used
    BEFORE DELETE OR UPDATE OF company_id, id ON plan_periods
    FOR EACH ROW EXECUTE FUNCTION capgate_keep_used_period();


-- ---------------------------------------------------------------------------------------------
-- Features, entitlements, routes (SPEC §8)
-- ---------------------------------------------------------------------------------------------

-- Features are never deleted, only made inactive (feature ids in routes.header_features and
-- api_keys.features are checked against this table when written).
CREATE TABLE features (
    id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    is_active boolean NOT NULL DEFAULT true,
    sort_order integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One plan x one feature. No row: the feature is not in the plan. NULL limits are unlimited. The
-- rate windows (as on plans) are counted apart, per company and feature and per user and
-- feature, after the plan's.
CREATE TABLE plan_features (
    plan_id text NOT NULL REFERENCES plans (id),
    feature_id text NOT NULL REFERENCES features (id),
    enabled boolean NOT NULL DEFAULT true,
    daily_limit bigint CHECK (daily_limit >= 0),
    period_limit bigint CHECK (period_limit >= 0),
    user_daily_limit bigint CHECK (user_daily_limit >= 0),
    user_period_limit bigint CHECK (user_period_limit >= 0),
    message text CHECK (length(message) BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now(),
    company_rpm integer CHECK (company_rpm BETWEEN 0 AND 1000000000),
    user_rpm integer CHECK (user_rpm BETWEEN 0 AND 1000000000),
    company_tpm bigint CHECK (company_tpm BETWEEN 0 AND 1000000000000),
    user_tpm bigint CHECK (user_tpm BETWEEN 0 AND 1000000000000),
    user_concurrency integer CHECK (user_concurrency BETWEEN 0 AND 1000000),
    PRIMARY KEY (plan_id, feature_id)
);

-- What a call costs and which feature it uses, by method and path (exact, or a prefix ending in
-- `*`). The gateway matches in memory; config_versions.routes tells it when to reload.
-- header_features: the only features the route's CapGate-Feature header may name (NULL: any
-- active feature).
CREATE TABLE routes (
    id text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    method text NOT NULL CHECK (method = '*' OR method ~ '^[A-Z]{1,16}$'),
    path text NOT NULL CHECK (path ~ '^/' AND length(path) <= 500 AND position('*' IN path) IN (0, length(path))),
    units integer NOT NULL DEFAULT 1 CHECK (units BETWEEN 0 AND 1000000),
    items_field text CHECK (length(items_field) BETWEEN 1 AND 200),
    feature text REFERENCES features (id),
    feature_header boolean NOT NULL DEFAULT false,
    allowed boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    header_features text[] CHECK (cardinality(header_features) <= 100 AND array_position(header_features, NULL) IS NULL),
    UNIQUE (method, path)
);

-- One row, read by every admission: routes is bumped by every change to the routes table, so a
-- gateway that matched a call against an older route table learns it in the same round trip and
-- matches again; thresholds (percent) and slot_lease_seconds (rate.leaseSeconds) are written by
-- `capgate serve` at start (one list per database).
CREATE TABLE config_versions (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    routes bigint NOT NULL DEFAULT 1,
    thresholds integer[] NOT NULL DEFAULT '{80,100}'
        CHECK (cardinality(thresholds) BETWEEN 0 AND 10 AND 1 <= ALL (thresholds) AND 100 >= ALL (thresholds)),
    slot_lease_seconds integer NOT NULL DEFAULT 600 CHECK (slot_lease_seconds > 0)
);
INSERT INTO config_versions (singleton) VALUES (true);

-- The body is db/functions/capgate_bump_routes_version.sql (as capgate_keep_used_period above).
CREATE FUNCTION capgate_bump_routes_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'capgate_bump_routes_version: db/functions/ not applied yet (run capgate migrate)';
END;
$$;

CREATE TRIGGER routes_bump_version
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON routes
    FOR EACH STATEMENT EXECUTE FUNCTION capgate_bump_routes_version();

-- Feature counters. span 'period' (starts_at = the plan period's start) or 'day' (starts_at =
-- midnight in the company's zone when the call was admitted). Lock order inside an admission:
-- company counter, user counter, then these: company period, company day, user period, user day.
CREATE TABLE company_feature_usage (
    company_id uuid NOT NULL,
    feature_id text NOT NULL,
    span text NOT NULL CHECK (span IN ('period', 'day')),
    starts_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (company_id, feature_id, span, starts_at)
);

CREATE TABLE user_feature_usage (
    company_id uuid NOT NULL,
    user_id uuid NOT NULL,
    feature_id text NOT NULL,
    span text NOT NULL CHECK (span IN ('period', 'day')),
    starts_at timestamptz NOT NULL,
    ends_at timestamptz NOT NULL,
    used bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    PRIMARY KEY (company_id, user_id, feature_id, span, starts_at)
);


-- ---------------------------------------------------------------------------------------------
-- The ledger (docs/ledger.md)
-- ---------------------------------------------------------------------------------------------

-- One row per admitted call. Rows are only ever appended, then settled once (tokens and upstream
-- status) or marked refunded; counters always equal the charged rows (`capgate verify`). A free
-- route's call is in the ledger with 0 units.
--
-- Partitioned by range of created_at (the call's time, which every admission writes): one
-- partition a UTC month named usage_ledger_pYYYYMM holding [YYYY-MM-01 00:00 UTC, the next
-- month's first instant), made ahead of the calls by capgate_ledger_partitions_ahead, plus
-- usage_ledger_default for a row whose month has no partition. The primary key must include the
-- partition key: (company_id, id, created_at). One row per id holds because ids come only from
-- the identity sequence (GENERATED ALWAYS; the batch takes nextval('usage_ledger_id_seq') itself,
-- OVERRIDING SYSTEM VALUE). No foreign key references usage_ledger (usage_ledger_attempts and
-- rate_calls name a ledger id without one) and no ON CONFLICT targets it. Lookups by
-- (company_id, id) use each partition's primary key index (in one partition when the row's time
-- is given too: capgate_refund's p_created_at).
--
-- feature_day: the feature day the call charged (the company's zone may change later).
-- Tokens: input_tokens, output_tokens, cache_*; hold_micros: what admission reserved (NULL:
-- nothing held: no price, or no max_tokens where no budget applies); cost_micros: what the
-- settled call cost (NULL: not settled, or not priced); cost_source: 'usage' (the provider's
-- usage), 'hold' (usage unknown: charged its hold), NULL while the hold is open.
-- rate_minute, rate_tokens, rate_scopes: what the call put in the rate windows, for its
-- settlement and refund (scopes bits: 1 the company's window, 2 the user's, 4 a concurrency slot,
-- 8 the company's window of the call's feature, 16 the user's window of it; NULL: none applied).
-- units_grant_id / cost_grant_id: the top-up grant that paid the call's units / its hold and
-- cost; units_grant_part / cost_grant_part: the part the grant paid (the plan's counters took the
-- rest). NULL with its grant id set: the grant paid the whole (rows written before the split);
-- every reader takes coalesce(part, whole).
CREATE TABLE usage_ledger (
    company_id uuid NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    period_id bigint NOT NULL,
    user_id uuid NOT NULL,
    units integer NOT NULL CHECK (units >= 0),
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
    feature_day timestamptz,
    cache_write_5m_tokens bigint,
    cache_write_1h_tokens bigint,
    cache_read_tokens bigint,
    hold_micros bigint CHECK (hold_micros >= 0),
    cost_micros bigint CHECK (cost_micros >= 0),
    cost_source text CHECK (cost_source IN ('usage', 'hold')),
    rate_minute timestamptz,
    rate_tokens bigint,
    rate_scopes smallint,
    units_grant_id bigint,
    cost_grant_id bigint,
    units_grant_part bigint,
    cost_grant_part bigint,
    PRIMARY KEY (company_id, id, created_at)
) PARTITION BY RANGE (created_at);
-- Not unique: two users may send the same Idempotency-Key, and a forgotten key may come back.
CREATE INDEX usage_ledger_idempotency ON usage_ledger (company_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX usage_ledger_time ON usage_ledger (company_id, created_at, id);
CREATE INDEX usage_ledger_feature ON usage_ledger (company_id, feature, created_at) WHERE feature IS NOT NULL;

CREATE TABLE usage_ledger_default PARTITION OF usage_ledger DEFAULT;

-- The current UTC month and the two after it; the gateway and `capgate rollover` make the later
-- ones (capgate_ledger_partitions_ahead).
DO $$
DECLARE
    v_month timestamp := date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC');
BEGIN
    FOR k IN 0..2 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF usage_ledger FOR VALUES FROM (%L) TO (%L)',
                       'usage_ledger_p' || to_char(v_month, 'YYYYMM'), v_month AT TIME ZONE 'UTC',
                       (v_month + interval '1 month') AT TIME ZONE 'UTC');
        v_month := v_month + interval '1 month';
    END LOOP;
END;
$$;

-- A charge that a retry replayed stands until every attempt failed: each replay of a charge
-- (a retry with its Idempotency-Key while it holds) is an attempt here, recorded in the admission
-- that decides it; capgate_refund records the failing attempt and gives the charge back only once
-- the first attempt and every replay have failed. No foreign key to the ledger: ledger rows are
-- never deleted by CapGate, and a key would add a check to every bulk delete an operator runs.
CREATE TABLE usage_ledger_attempts (
    company_id uuid NOT NULL,
    ledger_id bigint NOT NULL,        -- the charged ledger row the attempt replayed
    request_id text NOT NULL,         -- the attempt's request id (the first attempt's is the ledger row's)
    failed boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (company_id, ledger_id, request_id)
);
CREATE INDEX usage_ledger_attempts_request ON usage_ledger_attempts (company_id, request_id);

-- Idempotency-Key (SPEC §2): a key belongs to the user who sent it and to the exact request
-- (fingerprint: SHA-256 of method, path and query, and the body's SHA-256). The first attempt
-- claims the key (state in_flight) in its admission transaction, before any counter is locked;
-- request_id is the attempt that holds the key now. A retry after success gets the kept answer
-- (response_*; response_kept false: too large to keep). Keys older than
-- capgate_idempotency_lifetime() are forgotten (capgate_idempotency_purge). Lock order for a call
-- with a key: this row, then the period, the company counter and the user counter.
CREATE TABLE idempotency_keys (
    company_id uuid NOT NULL,
    user_id uuid NOT NULL,
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint bytea NOT NULL,
    state text NOT NULL CHECK (state IN ('in_flight', 'succeeded', 'failed')),
    request_id text NOT NULL,
    response_status integer,
    response_type text,
    response_body bytea CHECK (octet_length(response_body) <= 67108864),
    response_kept boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (company_id, user_id, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);


-- ---------------------------------------------------------------------------------------------
-- Rate windows of features and concurrency slots (SPEC §14, docs/rate-windows.md)
-- ---------------------------------------------------------------------------------------------

-- The windows of an entitlement (plan_features) that sets some: one row per window owner, not
-- per minute: the company's (user_id the nil UUID) and each user's, per feature. `minute` is the
-- window the counts belong to; the first call of a later minute starts it again at zero in the
-- same update, so nothing is ever purged. Counts of a refused call are never added. (The plan's
-- own windows are in the period counters, company_usage and user_usage.)
CREATE TABLE rate_windows (
    company_id uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    user_id uuid NOT NULL,
    feature_id text NOT NULL DEFAULT '',
    minute timestamptz NOT NULL,
    calls bigint NOT NULL CHECK (calls >= 0),
    tokens bigint NOT NULL,
    PRIMARY KEY (company_id, user_id, feature_id)
);

-- The calls in flight that hold a concurrency slot, from admission until the call ends (answer
-- done or client gone: deleted; upstream failed: the refund deletes it). feature_id: the call's
-- feature, '' for none; minute, tokens, scopes: where it is counted and what it holds (the bits
-- of usage_ledger.rate_scopes). A gateway that dies leaves its rows, which stop counting at
-- lease_until and are purged by the gateways' hourly job. No foreign key to companies: it ran one
-- RI query a row under a KEY SHARE lock on the company's row, a multixact for a busy company;
-- a company is never deleted, and a row is written only by an admission of the company that has
-- locked its period.
CREATE TABLE rate_calls (
    company_id uuid NOT NULL,
    ledger_id bigint NOT NULL,
    user_id uuid NOT NULL,
    feature_id text NOT NULL DEFAULT '',
    minute timestamptz NOT NULL,
    tokens bigint NOT NULL,
    scopes smallint NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (company_id, ledger_id)
);
CREATE INDEX rate_calls_slots ON rate_calls (company_id, user_id, lease_until) WHERE (scopes & 4) <> 0;


-- ---------------------------------------------------------------------------------------------
-- Threshold notifications (SPEC §9, docs/notifications.md)
-- ---------------------------------------------------------------------------------------------

-- An outbox written by the admission, delivered by the gateways as signed webhooks. A row is
-- written in the admission transaction that makes a bounded counter reach a threshold percentage
-- of its limit: at most one per counter, window instance and threshold (the unique key; a refund
-- and a new crossing write nothing new, a new period or day starts over). Gateways claim due rows
-- with FOR UPDATE SKIP LOCKED. user_id NULL: the company's counter; feature_id NULL: the cap.
CREATE TABLE notifications (
    company_id uuid NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id uuid,
    scope text NOT NULL CHECK (scope IN ('company', 'user')),
    feature_id text,
    span text NOT NULL CHECK (span IN ('period', 'day')),
    window_start timestamptz NOT NULL,
    window_end timestamptz NOT NULL,
    threshold integer NOT NULL,
    used bigint NOT NULL,
    limit_value bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    status text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error text,
    delivered_at timestamptz,
    PRIMARY KEY (company_id, id),
    UNIQUE NULLS NOT DISTINCT (company_id, scope, user_id, feature_id, span, window_start, threshold)
);
CREATE INDEX notifications_due ON notifications (next_attempt_at) WHERE status = 'pending';
CREATE INDEX notifications_company_time ON notifications (company_id, created_at DESC, id);


-- ---------------------------------------------------------------------------------------------
-- Billing: store events, the App Store, top-ups (SPEC §12, docs/app-store.md)
-- ---------------------------------------------------------------------------------------------

-- Every store event and every change the billing job made, with its raw payload. result: the
-- answer given, repeated for a duplicate delivery.
CREATE TABLE billing_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    company_id uuid,
    type text NOT NULL,
    transaction_id text UNIQUE,
    product_id text,
    plan_id text,
    payload jsonb NOT NULL DEFAULT '{}',
    result text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX billing_events_company ON billing_events (company_id, created_at);

-- Every verified App Store notification, once per notificationUUID (Apple retries and repeats
-- them), with what was done: applied, stale (signed before the last one applied for its original
-- transaction), kept (a downgrade, applied at the next renewal), stored (TEST, one-time charges,
-- types CapGate does not apply), unmatched (no company), refused (a purchase stored without being
-- applied, the reason in detail; app-posted transactions too, notification_type 'TRANSACTION'),
-- failed (see detail). The payload is the decoded, verified notification (never the raw JWS).
CREATE TABLE apple_notifications (
    notification_uuid text PRIMARY KEY CHECK (length(notification_uuid) BETWEEN 1 AND 100),
    company_id uuid REFERENCES companies (id),
    notification_type text NOT NULL,
    subtype text,
    environment text NOT NULL,
    signed_at timestamptz NOT NULL,
    original_transaction_id text,
    transaction_id text,
    product_id text,
    outcome text NOT NULL
        CHECK (outcome IN ('applied', 'stale', 'kept', 'stored', 'unmatched', 'refused', 'failed')),
    detail text,
    payload jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_notifications_unmatched ON apple_notifications (received_at) WHERE company_id IS NULL;
CREATE INDEX apple_notifications_for_operator ON apple_notifications (received_at) WHERE outcome IN ('unmatched', 'refused');

-- The company an App Store subscription (its originalTransactionId) belongs to, and the
-- signedDate of the last notification applied for it (out-of-order deliveries are not applied).
CREATE TABLE apple_transactions (
    original_transaction_id text PRIMARY KEY CHECK (length(original_transaction_id) BETWEEN 1 AND 100),
    company_id uuid NOT NULL REFERENCES companies (id),
    last_applied_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_transactions_company ON apple_transactions (company_id);

-- What a top-up purchase granted a company, once per store transaction (a second delivery of the
-- same purchase finds it and grants nothing). units / budget_micros: granted (NULL: none of it).
-- units_used: the units of the charged calls it paid; cost_used / cost_held: the settled costs
-- and open holds of the charged calls whose cost it paid. Admission draws on grants only for what
-- the plan's company cap or budget cannot hold. A refund of the pack sets refunded_at: what is
-- left is gone, what was used stays used; a refund that arrives before the purchase is recorded
-- as a refunded grant, so the purchase, posted later, grants nothing.
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
    CONSTRAINT topup_grants_check CHECK (expires_at > granted_at),
    CONSTRAINT topup_grants_check1 CHECK (units IS NOT NULL OR budget_micros IS NOT NULL)
);
-- The grants admission may draw on, in the order it draws (oldest expiry first): one index probe
-- answers "none" for a company without grants.
CREATE INDEX topup_grants_draw ON topup_grants (company_id, expires_at, id) WHERE refunded_at IS NULL;


-- ---------------------------------------------------------------------------------------------
-- The price book (SPEC §11, docs/budgets.md)
-- ---------------------------------------------------------------------------------------------

-- What the provider bills per million tokens, by model and from when; capgate_price picks the row
-- in force with one probe of the primary key (model, effective_from) per candidate pattern.
-- model: an exact model id, or a prefix ending in `*` (the only `*`); printable ASCII without
-- spaces. Rates in micro-dollars per million tokens ("3.75" USD is 3750000), at most 10^10, and
-- windows at most 10^8 tokens, so tokens x rate stays below 10^18 and fits a bigint. The
-- long-prompt tier (every token of a request whose prompt is over long_prompt_threshold tokens)
-- is all null or all set.
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
    CONSTRAINT prices_check CHECK (num_nulls(long_prompt_threshold, long_prompt_input, long_prompt_output,
                                             long_prompt_cache_write_5m, long_prompt_cache_write_1h,
                                             long_prompt_cache_read) IN (0, 6)),
    CONSTRAINT prices_check1 CHECK (long_prompt_threshold < context_window),
    PRIMARY KEY (model, effective_from)
);


-- ---------------------------------------------------------------------------------------------
-- The audit log (SPEC §13, docs/audit-log.md)
-- ---------------------------------------------------------------------------------------------

-- One row per change made through the admin or operator API, written in the transaction of the
-- change (a change that fails writes none). actor: the admin's user id or the operator token's
-- name; before / after: the object as the API shows it (never a secret), NULL before a create and
-- after a delete. Read newest first (id descending), by company or for the whole gateway.
CREATE TABLE audit_log (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    actor text NOT NULL,
    company_id uuid,
    action text NOT NULL CHECK (action ~ '^[a-z_]+\.[a-z_]+$'),
    target_id text,
    before jsonb,
    after jsonb,
    request_id text
);
CREATE INDEX audit_log_company ON audit_log (company_id, id DESC) WHERE company_id IS NOT NULL;
CREATE INDEX audit_log_action ON audit_log (action, id DESC);


-- ---------------------------------------------------------------------------------------------
-- The ledger's exports and retention (docs/ledger.md#retention)
-- ---------------------------------------------------------------------------------------------

-- Whole UTC months of the ledger written to a file (`capgate ledger export`): one row per month
-- and format, replaced by a later export of the same. rows: the ledger rows the file holds; bytes
-- and sha256: the file's size and SHA-256 (lower-case hex, as sha256sum prints it); path: where it
-- was written, absolute, as the exporting host saw it. Retention drops no month without a row here.
CREATE TABLE ledger_exports (
    month date NOT NULL CHECK (extract(day FROM month) = 1),
    format text NOT NULL CHECK (format IN ('jsonl', 'csv')),
    rows bigint NOT NULL CHECK (rows >= 0),
    bytes bigint NOT NULL CHECK (bytes >= 0),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    path text NOT NULL,
    exported_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (month, format)
);

-- One row per month dropped by retention: when, and which export the drop relied on.
CREATE TABLE ledger_dropped_months (
    month date PRIMARY KEY CHECK (extract(day FROM month) = 1),
    rows bigint NOT NULL CHECK (rows >= 0),
    format text NOT NULL CHECK (format IN ('jsonl', 'csv')),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    path text NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A dropped month's charged rows, summed per key `capgate verify` groups by: counters keep the
-- usage of periods whose months were dropped, and verify sums these totals with the rows still
-- held (usage_ledger_charged_all). No foreign key to ledger_dropped_months: this table is a
-- company's (distributed by company_id), that one the coordinator's; the drop writes both in one
-- transaction.
CREATE TABLE ledger_dropped_totals (
    company_id uuid NOT NULL,
    month date NOT NULL,
    period_id bigint NOT NULL,
    user_id uuid NOT NULL,
    feature text,
    feature_day timestamptz,
    units_grant_id bigint,
    cost_grant_id bigint,
    calls bigint NOT NULL,
    units bigint NOT NULL,
    company_units bigint,
    company_cost_used bigint,
    company_cost_held bigint,
    user_cost_used bigint,
    user_cost_held bigint,
    feature_units bigint,
    grant_units bigint,
    grant_cost_used bigint,
    grant_cost_held bigint,
    CONSTRAINT ledger_dropped_totals_key UNIQUE NULLS NOT DISTINCT
        (company_id, month, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id)
);
CREATE INDEX ledger_dropped_totals_period ON ledger_dropped_totals (company_id, period_id);

-- Each charged row of the ledger with the parts verify sums (the company's, the user's, the
-- feature's, the grants'), written once: retention's drop groups this view over the month into
-- ledger_dropped_totals, and verify sums the view and the totals, the same expressions for the
-- rows held and the rows dropped. SUM ignores NULLs, so a part NULL for a row stays out.
CREATE VIEW usage_ledger_charged AS
SELECT company_id, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id, created_at,
       units::bigint AS units,
       (units - CASE WHEN units_grant_id IS NULL THEN 0 ELSE COALESCE(units_grant_part, units) END)::bigint AS company_units,
       (CASE WHEN cost_source IS NOT NULL
             THEN CASE WHEN cost_grant_id IS NULL THEN cost_micros
                       ELSE LEAST(cost_micros, hold_micros - COALESCE(cost_grant_part, hold_micros)) END END)::bigint
           AS company_cost_used,
       (CASE WHEN cost_source IS NULL
             THEN hold_micros - CASE WHEN cost_grant_id IS NULL THEN 0 ELSE COALESCE(cost_grant_part, hold_micros) END END)::bigint
           AS company_cost_held,
       (CASE WHEN cost_source IS NOT NULL THEN cost_micros END)::bigint AS user_cost_used,
       (CASE WHEN cost_source IS NULL THEN hold_micros END)::bigint AS user_cost_held,
       (CASE WHEN feature IS NOT NULL AND units > 0 THEN units END)::bigint AS feature_units,
       (CASE WHEN units_grant_id IS NOT NULL THEN COALESCE(units_grant_part, units) END)::bigint AS grant_units,
       (CASE WHEN cost_grant_id IS NOT NULL AND cost_source IS NOT NULL
             THEN cost_micros - LEAST(cost_micros, hold_micros - COALESCE(cost_grant_part, hold_micros)) END)::bigint
           AS grant_cost_used,
       (CASE WHEN cost_grant_id IS NOT NULL AND cost_source IS NULL THEN COALESCE(cost_grant_part, hold_micros) END)::bigint
           AS grant_cost_held
  FROM usage_ledger
 WHERE outcome = 'charged';

-- The ledger's charged rows and the dropped months' totals, as verify reads them.
CREATE VIEW usage_ledger_charged_all AS
SELECT company_id, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id, units, company_units,
       company_cost_used, company_cost_held, user_cost_used, user_cost_held, feature_units, grant_units, grant_cost_used,
       grant_cost_held
  FROM usage_ledger_charged
UNION ALL
SELECT company_id, period_id, user_id, feature, feature_day, units_grant_id, cost_grant_id, units, company_units,
       company_cost_used, company_cost_held, user_cost_used, user_cost_held, feature_units, grant_units, grant_cost_used,
       grant_cost_held
  FROM ledger_dropped_totals;


-- ---------------------------------------------------------------------------------------------
-- Rollups of the ledger (docs/ledger.md#rollups)
-- ---------------------------------------------------------------------------------------------

-- The console's daily chart, the per-model read and the unsettled charges' reports sum the
-- charged rows of a company's quarter hours instead of its calls: O(days), not O(calls). A row
-- sums the charged ledger rows of one company, quarter hour (UTC, created_at down to :00, :15,
-- :30 or :45: every zone's midnight falls on one), plan period, feature and model.
-- cost_micros / held_micros: SPEC §11 as verify counts cost (a row's cost once it has a
-- cost_source, its hold while it has none); unsettled: charged rows with settled_at NULL (a
-- partial index finds the few quarter hours that hold one).
--
-- Kept exactly, in the transaction of every change: statement triggers on usage_ledger add what
-- the statement changed, new rows' parts less old rows', grouped by key, to usage_rollup_changes
-- (appended, never updated, no index: no two statements wait for each other there); a compaction
-- (capgate_rollup_compact, a gateway job) moves them into usage_rollups; a read sums both
-- (usage_rollups_all, one snapshot). Retention's drop of a month fires no trigger: the rollups
-- keep the dropped months.
CREATE TABLE usage_rollups (
    company_id uuid NOT NULL,
    bucket timestamptz NOT NULL,
    period_id bigint NOT NULL,
    feature text,
    model text,
    calls bigint NOT NULL,
    units bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_write_tokens bigint NOT NULL,
    cache_read_tokens bigint NOT NULL,
    cost_micros bigint NOT NULL,
    held_micros bigint NOT NULL,
    unsettled bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX usage_rollups_key ON usage_rollups (company_id, bucket, period_id, feature, model) NULLS NOT DISTINCT;
CREATE INDEX usage_rollups_unsettled ON usage_rollups (bucket) WHERE unsettled <> 0;

-- What ledger statements changed since the last compaction: the same columns, signed.
CREATE TABLE usage_rollup_changes (LIKE usage_rollups INCLUDING DEFAULTS);

CREATE VIEW usage_rollups_all AS
SELECT * FROM usage_rollups
UNION ALL
SELECT * FROM usage_rollup_changes;

-- One ledger row's part of its rollup row: zero rows for a row that is not charged. Written once,
-- here, for the triggers, `capgate verify` and capgate_rollup_rebuild. It and the trigger function
-- are not in db/functions: the set would re-create the trigger function, leaving the ledger's
-- triggers on a stand-in between the two, and a migration that backfills rollups needs them
-- before the set runs.
CREATE FUNCTION ledger_rollup_part(l usage_ledger, sign integer DEFAULT 1)
RETURNS TABLE (company_id uuid, bucket timestamptz, period_id bigint, feature text, model text, calls bigint,
               units bigint, input_tokens bigint, output_tokens bigint, cache_write_tokens bigint,
               cache_read_tokens bigint, cost_micros bigint, held_micros bigint, unsettled bigint)
LANGUAGE sql IMMUTABLE
AS $$
    SELECT l.company_id, date_bin('15 minutes', l.created_at, timestamptz '2000-01-01 00:00:00+00'), l.period_id,
           l.feature, l.model, sign::bigint, sign * l.units::bigint, sign * coalesce(l.input_tokens, 0),
           sign * coalesce(l.output_tokens, 0),
           sign * (coalesce(l.cache_write_5m_tokens, 0) + coalesce(l.cache_write_1h_tokens, 0)),
           sign * coalesce(l.cache_read_tokens, 0),
           sign * CASE WHEN l.cost_source IS NOT NULL THEN coalesce(l.cost_micros, 0) ELSE 0 END,
           sign * CASE WHEN l.cost_source IS NULL THEN coalesce(l.hold_micros, 0) ELSE 0 END,
           sign * CASE WHEN l.settled_at IS NULL THEN 1 ELSE 0 END::bigint
     WHERE l.outcome = 'charged'
$$;

-- The statement triggers' function: the statement's new rows' parts less its old rows', per key,
-- keys whose sums did not move left out (a settlement that only records the upstream status).
CREATE FUNCTION capgate_ledger_rollup() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) p
         GROUP BY 1, 2, 3, 4, 5;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM (SELECT q.* FROM new_rows n CROSS JOIN LATERAL ledger_rollup_part(n) q
                UNION ALL
                SELECT q.* FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) q) p
         GROUP BY 1, 2, 3, 4, 5
        HAVING sum(p.calls) <> 0 OR sum(p.units) <> 0 OR sum(p.input_tokens) <> 0 OR sum(p.output_tokens) <> 0
            OR sum(p.cache_write_tokens) <> 0 OR sum(p.cache_read_tokens) <> 0 OR sum(p.cost_micros) <> 0
            OR sum(p.held_micros) <> 0 OR sum(p.unsettled) <> 0;
    ELSE
        INSERT INTO usage_rollup_changes
        SELECT p.company_id, p.bucket, p.period_id, p.feature, p.model, sum(p.calls), sum(p.units), sum(p.input_tokens),
               sum(p.output_tokens), sum(p.cache_write_tokens), sum(p.cache_read_tokens), sum(p.cost_micros),
               sum(p.held_micros), sum(p.unsettled)
          FROM old_rows o CROSS JOIN LATERAL ledger_rollup_part(o, -1) p
         GROUP BY 1, 2, 3, 4, 5;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER usage_ledger_rollup_insert AFTER INSERT ON usage_ledger
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();
CREATE TRIGGER usage_ledger_rollup_update AFTER UPDATE ON usage_ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();
CREATE TRIGGER usage_ledger_rollup_delete AFTER DELETE ON usage_ledger
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION capgate_ledger_rollup();
