-- One kind of feature counter of a batch, locked (or created at zero) in key order for
-- capgate_batch_lock: the company's (p_user false: company_feature_usage) or the user's
-- (user_feature_usage) of p_span, 'period' (the call's period, slots fps and ups) or 'day' (the
-- feature day holding the call, slots fds and uds). The rows by slot number.
CREATE FUNCTION capgate_batch_lock_feature(
    p_calls capgate_batch_call[], p_span text, p_user boolean
) RETURNS capgate_batch_counter[]
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_rows capgate_batch_counter[];
BEGIN
    IF NOT p_user THEN
        WITH slot AS (
            SELECT DISTINCT CASE p_span WHEN 'period' THEN s.fps ELSE s.fds END AS slot, s.company AS c, s.feature AS f,
                   CASE p_span WHEN 'period' THEN s.started_at ELSE s.dstart END AS st,
                   CASE p_span WHEN 'period' THEN s.ends_at ELSE s.dend END AS en
              FROM unnest(p_calls) s WHERE s.fps IS NOT NULL
        ), locked AS (
            INSERT INTO company_feature_usage AS fu (company_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.f, p_span, slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.f, slot.st
            ON CONFLICT (company_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(ROW(l.company_id, NULL, NULL, l.feature_id, l.starts_at, l.used, NULL, NULL, NULL, NULL, NULL,
                             NULL, false)::capgate_batch_counter ORDER BY slot.slot)
          INTO v_rows
          FROM slot JOIN locked l ON l.company_id = slot.c AND l.feature_id = slot.f AND l.starts_at = slot.st;
    ELSE
        WITH slot AS (
            SELECT DISTINCT CASE p_span WHEN 'period' THEN s.ups ELSE s.uds END AS slot, s.company AS c,
                   s.user_id AS u, s.feature AS f,
                   CASE p_span WHEN 'period' THEN s.started_at ELSE s.dstart END AS st,
                   CASE p_span WHEN 'period' THEN s.ends_at ELSE s.dend END AS en
              FROM unnest(p_calls) s WHERE s.ups IS NOT NULL
        ), locked AS (
            INSERT INTO user_feature_usage AS fu (company_id, user_id, feature_id, span, starts_at, ends_at, used)
            SELECT slot.c, slot.u, slot.f, p_span, slot.st, slot.en, 0 FROM slot ORDER BY slot.c, slot.u, slot.f, slot.st
            ON CONFLICT (company_id, user_id, feature_id, span, starts_at) DO UPDATE SET used = fu.used
            RETURNING fu.company_id, fu.user_id, fu.feature_id, fu.starts_at, fu.used
        )
        SELECT array_agg(ROW(l.company_id, NULL, l.user_id, l.feature_id, l.starts_at, l.used, NULL, NULL, NULL, NULL,
                             NULL, NULL, false)::capgate_batch_counter ORDER BY slot.slot)
          INTO v_rows
          FROM slot JOIN locked l
            ON l.company_id = slot.c AND l.user_id = slot.u AND l.feature_id = slot.f AND l.starts_at = slot.st;
    END IF;
    RETURN v_rows;
END;
$$;
