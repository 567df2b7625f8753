-- Writes the notifications a charge of p_units that brought a counter to p_used (of p_limit)
-- earned: one per threshold t of p_thresholds with used-before < t % of the limit <= p_used.
-- Once per counter, window and threshold (the table's unique key): a crossing after a refund
-- writes nothing. Wakes the gateways' deliverers at commit (NOTIFY capgate_notifications).
-- Admissions call it only when p_used reached the lowest threshold, so a call far from its
-- limits pays nothing.
CREATE FUNCTION capgate_notify(
    p_company uuid, p_user uuid, p_feature text, p_span text, p_start timestamptz, p_end timestamptz,
    p_used bigint, p_units integer, p_limit bigint, p_thresholds integer[]
) RETURNS void
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 OR p_units <= 0 THEN
        RETURN;
    END IF;
    INSERT INTO notifications (company_id, user_id, scope, feature_id, span, window_start, window_end, threshold, used,
                               limit_value)
    SELECT p_company, p_user, CASE WHEN p_user IS NULL THEN 'company' ELSE 'user' END, p_feature, p_span, p_start, p_end,
           t, p_used, p_limit
      FROM unnest(p_thresholds) t
     WHERE (p_used - p_units) * 100 < t::bigint * p_limit AND p_used * 100 >= t::bigint * p_limit
    ON CONFLICT DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('capgate_notifications', '');
    END IF;
END;
$$;
