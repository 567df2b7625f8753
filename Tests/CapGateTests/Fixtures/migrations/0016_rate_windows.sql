-- Rate windows and concurrency (SPEC §14): how fast a company and each of its users may call,
-- kept where the caps are so that every gateway admits against the same rows.
--
-- Per fixed UTC minute: company_rpm / user_rpm (calls), company_tpm / user_tpm (tokens: held as
-- the call's prompt bound plus max_tokens, settled to the real count); user_concurrency (calls in
-- flight at once). NULL: none.
ALTER TABLE plans
    ADD COLUMN company_rpm integer CHECK (company_rpm BETWEEN 0 AND 1000000000),
    ADD COLUMN user_rpm integer CHECK (user_rpm BETWEEN 0 AND 1000000000),
    ADD COLUMN company_tpm bigint CHECK (company_tpm BETWEEN 0 AND 1000000000000),
    ADD COLUMN user_tpm bigint CHECK (user_tpm BETWEEN 0 AND 1000000000000),
    ADD COLUMN user_concurrency integer CHECK (user_concurrency BETWEEN 0 AND 1000000);
-- An entitlement (one plan x one feature) may set the same five for the calls of its feature:
-- counted apart, per company and feature and per user and feature, after the plan's.
ALTER TABLE plan_features
    ADD COLUMN company_rpm integer CHECK (company_rpm BETWEEN 0 AND 1000000000),
    ADD COLUMN user_rpm integer CHECK (user_rpm BETWEEN 0 AND 1000000000),
    ADD COLUMN company_tpm bigint CHECK (company_tpm BETWEEN 0 AND 1000000000000),
    ADD COLUMN user_tpm bigint CHECK (user_tpm BETWEEN 0 AND 1000000000000),
    ADD COLUMN user_concurrency integer CHECK (user_concurrency BETWEEN 0 AND 1000000);

-- One row per window owner, not per minute: the company's (user_id the nil UUID) and each user's,
-- for the plan's windows (feature_id '') and for each feature whose entitlement sets some.
-- `minute` is the window the counts belong to; the first call of a later minute starts it again
-- at zero in the same update, so the table holds one row per company and per user who called
-- with a window set, and nothing is ever purged. Counts of a refused call are never added.
CREATE TABLE rate_windows (
    company_id uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
    user_id uuid NOT NULL,
    feature_id text NOT NULL DEFAULT '',
    minute timestamptz NOT NULL,
    calls bigint NOT NULL CHECK (calls >= 0),
    tokens bigint NOT NULL,
    PRIMARY KEY (company_id, user_id, feature_id)
);

-- The calls in flight that their end must settle in the windows: those holding a concurrency
-- slot (scopes has 4: the plan, or the entitlement of the call's feature, sets user_concurrency)
-- or tokens in a token window. A row from admission until the call ends (answer done: deleted
-- with its tokens settled; client gone: its slot freed; upstream failed: the refund deletes it).
-- feature_id: the call's feature, '' for none; minute, tokens, scopes: where it is counted and
-- what it holds there (the bits of usage_ledger.rate_scopes). A gateway that dies leaves its
-- rows, which stop counting at lease_until (rate.leaseSeconds after the admission) and are
-- purged by the gateways' hourly job.
CREATE TABLE rate_calls (
    company_id uuid NOT NULL REFERENCES companies (id) ON DELETE CASCADE,
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

-- What a call put in the windows, for its refund: the minute, the tokens it held there and which
-- rows it is in
-- (1: the company's window, 2: the user's, 4: a concurrency slot, 8: the company's window of the
-- call's feature, 16: the user's window of it). NULL: no window applied.
ALTER TABLE usage_ledger
    ADD COLUMN rate_minute timestamptz,
    ADD COLUMN rate_tokens bigint,
    ADD COLUMN rate_scopes smallint;

-- rate.leaseSeconds, as the gateways last wrote it at start (the admission reads it with the
-- route version and the thresholds).
ALTER TABLE config_versions ADD COLUMN slot_lease_seconds integer NOT NULL DEFAULT 600 CHECK (slot_lease_seconds > 0);
