-- Per-row foreign key checks off the admission hot path.
--
-- The ledger's and the counters' foreign keys to plan_periods ran one RI query (SELECT ... FOR
-- KEY SHARE on the period) for every ledger row inserted and for every counter row updated by
-- an admission batch (a counter row the batch had just locked by upsert counts as new): 95 RI
-- queries in a 32-call batch, measured with auto_explain at about half of its 4 ms. The
-- guarantee they gave, no ledger or counter row for a period that does not exist, now holds by:
--   1. every admission locks the period rows it charges against FOR KEY SHARE, once per period
--      and before any counter (lock order: period, company counter, user counter), so a period
--      cannot be deleted or re-keyed while an admission against it is in flight;
--   2. a trigger refuses to delete or re-key a period that ledger rows reference (what the
--      foreign keys' ON DELETE NO ACTION did), and deletes the period's counter rows with it
--      (they are all zero when no ledger row references the period).
-- The admission functions themselves are unchanged: they are wrapped.

ALTER TABLE usage_ledger DROP CONSTRAINT usage_ledger_company_id_period_id_fkey;
ALTER TABLE company_usage DROP CONSTRAINT company_usage_company_id_period_id_fkey;
ALTER TABLE user_usage DROP CONSTRAINT user_usage_company_id_period_id_fkey;

CREATE FUNCTION capgate_keep_used_period() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM usage_ledger WHERE company_id = OLD.company_id AND period_id = OLD.id) THEN
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

CREATE TRIGGER plan_periods_keep_used
    BEFORE DELETE OR UPDATE OF company_id, id ON plan_periods
    FOR EACH ROW EXECUTE FUNCTION capgate_keep_used_period();

-- Single-call admission: lock the period containing p_at, then admit as before.
ALTER FUNCTION capgate_admit(uuid, uuid, integer, text, text, text, text, text, text, timestamptz)
    RENAME TO capgate_admit_in_locked_period;

CREATE FUNCTION capgate_admit(
    p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_idempotency_key text, p_at timestamptz
) RETURNS capgate_admission
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM plan_periods
     WHERE company_id = p_company AND started_at <= p_at AND ends_at > p_at
       FOR KEY SHARE;
    RETURN capgate_admit_in_locked_period(p_company, p_user, p_units, p_method, p_route, p_model, p_feature,
                                          p_request_id, p_idempotency_key, p_at);
END;
$$;

-- Batched admission: lock every period the batch charges against, in (company, period) order,
-- with one statement, then admit as before.
ALTER FUNCTION capgate_admit_batch(bytea[], uuid[], uuid[], integer[], text[], text[], text[], text[], text[], text[],
                                   timestamptz[], boolean)
    RENAME TO capgate_admit_batch_in_locked_periods;

CREATE FUNCTION capgate_admit_batch(
    p_key_hash bytea[], p_company uuid[], p_user uuid[], p_units integer[], p_method text[], p_route text[],
    p_model text[], p_feature text[], p_request_id text[], p_idempotency_key text[], p_at timestamptz[],
    p_relaxed boolean
) RETURNS TABLE (
    item integer, auth text, company uuid, member uuid, member_role text,
    decision text, ledger bigint, period bigint, plan text, plan_name text,
    period_start timestamptz, period_end timestamptz, company_used bigint, company_cap bigint,
    user_used bigint, user_cap bigint
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    PERFORM 1 FROM plan_periods pp
     WHERE (pp.company_id, pp.id) IN (
            SELECT q.company_id, q.id
              FROM unnest(p_key_hash, p_company, p_at) AS i(kh, co, at)
              LEFT JOIN api_keys k ON i.kh <> ''::bytea AND k.key_hash = i.kh
              JOIN plan_periods q ON q.company_id = coalesce(k.company_id, nullif(i.co, '00000000-0000-0000-0000-000000000000'::uuid))
                                 AND q.started_at <= i.at AND q.ends_at > i.at)
     ORDER BY pp.company_id, pp.id
       FOR KEY SHARE;
    RETURN QUERY
        SELECT * FROM capgate_admit_batch_in_locked_periods(p_key_hash, p_company, p_user, p_units, p_method, p_route,
                                                             p_model, p_feature, p_request_id, p_idempotency_key, p_at,
                                                             p_relaxed);
END;
$$;
