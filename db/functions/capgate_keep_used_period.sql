-- Refuses to delete or re-key a plan period that ledger rows reference, or the totals of a
-- ledger month dropped by retention (ledger_dropped_totals, 0027: its counters still count those
-- calls, and verify still checks them), and deletes its counter rows with it (trigger
-- plan_periods_keep_used, 0005; they are all zero when no ledger row references the period).
CREATE OR REPLACE FUNCTION capgate_keep_used_period() RETURNS trigger
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM usage_ledger WHERE company_id = OLD.company_id AND period_id = OLD.id)
       OR EXISTS (SELECT 1 FROM ledger_dropped_totals WHERE company_id = OLD.company_id AND period_id = OLD.id) THEN
        RAISE EXCEPTION 'plan period % of company % has usage in the ledger', OLD.id, OLD.company_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'usage_ledger_period';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF EXISTS (SELECT 1 FROM company_usage WHERE company_id = OLD.company_id AND period_id = OLD.id) THEN
            RAISE EXCEPTION 'plan period % of company % has usage counters', OLD.id, OLD.company_id
                USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'company_usage_period';
        END IF;
        RETURN NEW;
    END IF;
    DELETE FROM user_usage WHERE company_id = OLD.company_id AND period_id = OLD.id;
    DELETE FROM company_usage WHERE company_id = OLD.company_id AND period_id = OLD.id;
    RETURN OLD;
END;
$$;

