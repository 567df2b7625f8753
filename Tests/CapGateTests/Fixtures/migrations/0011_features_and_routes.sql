-- Features, entitlements, routes and day windows (SPEC §8). Tables and data only: the functions
-- that read them live in db/functions/ (re-applied by `capgate migrate` when they change).
--
-- A database migrated from 0010 behaves exactly as before until the operator adds features or
-- routes: with no route every call costs 1 unit and names no feature, and feature counters are
-- only ever touched for a call that names a feature.

-- Days are midnight to midnight in the company's zone (an IANA name PostgreSQL knows).
ALTER TABLE companies ADD COLUMN time_zone text NOT NULL DEFAULT 'UTC' CHECK (length(time_zone) BETWEEN 1 AND 64);

CREATE TABLE features (
    id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    name text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    is_active boolean NOT NULL DEFAULT true,
    sort_order integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One plan × one feature. No row: the feature is not in the plan. NULL limits are unlimited.
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
    PRIMARY KEY (plan_id, feature_id)
);

-- What a call costs and which feature it uses, by method and path (exact, or a prefix ending
-- in `*`). The gateway matches in memory; `config_versions.routes` tells it when to reload.
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
    UNIQUE (method, path)
);

-- One row: bumped by every change to routes, read by every admission, so a gateway that matched
-- a call against an older route table learns it in the same round trip and matches again.
CREATE TABLE config_versions (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    routes bigint NOT NULL DEFAULT 1
);
INSERT INTO config_versions (singleton, routes) VALUES (true, 1);

CREATE FUNCTION capgate_bump_routes_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE config_versions SET routes = routes + 1 WHERE singleton;
    RETURN NULL;
END;
$$;

CREATE TRIGGER routes_bump_version
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON routes
    FOR EACH STATEMENT EXECUTE FUNCTION capgate_bump_routes_version();

-- Feature counters. `span` is 'period' (starts_at = the plan period's start) or 'day' (starts_at
-- = midnight in the company's zone when the call was admitted). Lock order inside an admission:
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

-- The ledger row says which feature day it charged (the zone may change later), and a free
-- route's call is in the ledger with 0 units.
ALTER TABLE usage_ledger ADD COLUMN feature_day timestamptz;
ALTER TABLE usage_ledger DROP CONSTRAINT usage_ledger_units_check;
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_units_check CHECK (units >= 0);
CREATE INDEX usage_ledger_feature ON usage_ledger (company_id, feature, created_at) WHERE feature IS NOT NULL;

-- Obsolete admission functions (the live ones are in db/functions/ from now on; 0010 left
-- these wrapped or unreachable).
DROP FUNCTION capgate_admit_in_locked_period(uuid, uuid, integer, text, text, text, text, text, text, timestamptz);
DROP FUNCTION capgate_admit_in_locked_period_0002(uuid, uuid, integer, text, text, text, text, text, text, timestamptz);
DROP FUNCTION capgate_admit_batch_0009(bytea[], uuid[], uuid[], integer[], text[], text[], text[], text[], text[], text[],
                                       timestamptz[], boolean);
