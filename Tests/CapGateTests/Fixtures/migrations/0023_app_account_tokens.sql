-- App Store purchases bound to the company that made them (SPEC §12, issue #47 item 1).

-- The appAccountToken an app sets on a purchase for this company: random, never the company id
-- (which every member sees), each existing company given its own. The operator rotates it
-- (POST /admin/v1/companies/{id}/app-account-token); the old one then matches nothing.
ALTER TABLE companies
    ADD COLUMN app_account_token uuid NOT NULL DEFAULT gen_random_uuid(),
    ADD COLUMN app_account_token_rotated_at timestamptz;
CREATE UNIQUE INDEX companies_app_account_token ON companies (app_account_token);

-- Where a period's plan came from: 'operator' (a company's creation, PUT …/plan) or 'store' (a
-- store event: the App Store's, or one the operator posted to /admin/v1/billing/events, and the
-- default plan a refund or an expiry moved the company to). store_subscription: the original
-- transaction id of the store subscription whose event set the plan (NULL for the operator's).
-- A store subscription replaces only the default plan or a 'store' one; a refund moves the
-- company only when its subscription is the one that set the running plan. The rollover's
-- renewed period keeps both.
ALTER TABLE plan_periods
    ADD COLUMN plan_origin text NOT NULL DEFAULT 'operator' CHECK (plan_origin IN ('operator', 'store')),
    ADD COLUMN store_subscription text;

UPDATE plan_periods SET plan_origin = 'store' WHERE source IN ('purchase', 'renewal', 'restore', 'refund', 'expire');
-- A period the rollover started continues the nearest earlier period that was not the rollover's.
UPDATE plan_periods p
   SET plan_origin = 'store'
 WHERE p.source = 'rollover'
   AND (SELECT q.source FROM plan_periods q
         WHERE q.company_id = p.company_id AND q.started_at < p.started_at AND q.source <> 'rollover'
         ORDER BY q.started_at DESC LIMIT 1) IN ('purchase', 'renewal', 'restore', 'refund', 'expire');
-- Existing links keep working: a store period of a company with App Store subscriptions was set
-- by the one last applied (what refunded it before this migration).
UPDATE plan_periods p
   SET store_subscription = (SELECT t.original_transaction_id FROM apple_transactions t
                              WHERE t.company_id = p.company_id
                              ORDER BY t.last_applied_at DESC NULLS LAST, t.created_at DESC LIMIT 1)
 WHERE p.plan_origin = 'store' AND p.source NOT IN ('refund', 'expire');

-- A store purchase CapGate stored without applying it (a company on the operator's plan, a
-- subscription linked to another company) is 'refused', with the reason in `detail`, and listed
-- with the unmatched ones. Transactions the app posts that are not applied are kept here too
-- (notification_type 'TRANSACTION').
ALTER TABLE apple_notifications DROP CONSTRAINT apple_notifications_outcome_check;
ALTER TABLE apple_notifications ADD CONSTRAINT apple_notifications_outcome_check
    CHECK (outcome IN ('applied', 'stale', 'kept', 'stored', 'unmatched', 'refused', 'failed'));
CREATE INDEX apple_notifications_for_operator ON apple_notifications (received_at) WHERE outcome IN ('unmatched', 'refused');
