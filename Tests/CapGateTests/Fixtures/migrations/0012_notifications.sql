-- Threshold notifications (SPEC §9): an outbox written by the admission, delivered by the
-- gateways as signed webhooks.
--
-- A row is written in the admission transaction that makes a bounded counter (company cap, user
-- cap, a feature's day or period limit, company- or user-wide) reach a threshold percentage of
-- its limit: at most one per counter, window instance and threshold (the unique key below; a
-- refund and a new crossing write nothing new, a new period or day starts over). Gateways claim
-- due rows with FOR UPDATE SKIP LOCKED, so several never send one row at the same time.

-- Where a company's notifications go (else `notifications.webhookUrl`).
ALTER TABLE companies ADD COLUMN webhook_url text
    CHECK (webhook_url ~ '^https?://[^[:space:]]+$' AND length(webhook_url) <= 2000);

-- The thresholds in percent, written by `capgate serve` from `notifications.thresholds` at
-- start (one list per database) and read by every admission with the routes version.
ALTER TABLE config_versions ADD COLUMN thresholds integer[] NOT NULL DEFAULT '{80,100}'
    CHECK (cardinality(thresholds) BETWEEN 0 AND 10 AND 1 <= ALL (thresholds) AND 100 >= ALL (thresholds));

CREATE TABLE notifications (
    company_id uuid NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    user_id uuid,                                 -- NULL: the company's counter
    scope text NOT NULL CHECK (scope IN ('company', 'user')),
    feature_id text,                              -- NULL: the monthly cap
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
