-- Retention of the ledger's months (issue #50 item 2, `ledger.retentionMonths`, SPEC §7;
-- docs/ledger.md#retention): a whole month past the retention, exported (ledger_exports, 0025)
-- and unchanged since, holding no unsettled charge, is detached from usage_ledger and dropped.
--
-- `capgate verify` recomputes every counter from the ledger, and counters keep the usage of
-- periods whose months were dropped (a period of a year-long plan, a top-up grant, a feature's
-- period window). So the drop keeps, in the same transaction, what verify sums of the month's
-- charged rows, grouped by every key verify groups by: ledger_dropped_totals. Verify reads the
-- ledger's rows and these totals as one relation (usage_ledger_charged_all) and checks every
-- counter as before: a counter still counts the dropped calls, and so does its recomputation.
--
-- What verify sums of a row is written once, in the view usage_ledger_charged (each charged
-- row's parts: the company's, the user's, the feature's, the grants'); the drop groups that view
-- over the month into ledger_dropped_totals, and verify sums the view and the totals: the same
-- expressions for the rows still held and the rows dropped. A sum over a group is the sum of the
-- rows' values (SUM ignores NULLs, so a part that is NULL for a row stays out as it did).

-- One row per month dropped: when, and which export the drop relied on.
CREATE TABLE ledger_dropped_months (
    month date PRIMARY KEY CHECK (extract(day FROM month) = 1),
    rows bigint NOT NULL CHECK (rows >= 0),
    format text NOT NULL CHECK (format IN ('jsonl', 'csv')),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    path text NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A dropped month's charged rows, summed per key verify groups by. No foreign key to
-- ledger_dropped_months: this table is a company's (distributed by company_id, docs/scale-out.md),
-- that one the coordinator's; the drop writes both in one transaction.
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

-- Each charged row of the ledger with the parts verify sums (BillingStore.verify and its
-- feature and grant checks). The same expressions the checks used on usage_ledger before 0027.
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
