-- SPEC §13: the audit log and the API key lifecycle.
--
-- audit_log: one row per change made through the admin or operator API, written in the
-- transaction of the change (a change that fails writes none). `actor` is the admin's user id
-- or the operator token's name ('operator' for the unnamed operator.token); `before`/`after`
-- are the object as the API shows it (never a secret: no key, hash, token or webhook secret);
-- NULL before a create and after a delete. Read newest first (`id` descending), by company or
-- for the whole gateway, optionally one action.
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

-- A key's name (a label for people), when it stops working (NULL: never; a rotation sets the old
-- key's), and when it was last used (written by a periodic flush, at most once a minute a key,
-- never inside an admission).
ALTER TABLE api_keys
    ADD COLUMN name text CHECK (char_length(name) <= 200),
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN last_used_at timestamptz;
