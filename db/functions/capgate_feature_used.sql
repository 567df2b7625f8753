-- A feature's four windows as they stand (company and user, period and day), 0 for a window
-- not used yet: what a refusal reports, read without locking (nothing is charged).
CREATE FUNCTION capgate_feature_used(
    p_company uuid, p_user uuid, p_feature text, p_period_start timestamptz, p_day_start timestamptz,
    OUT fc_period bigint, OUT fc_day bigint, OUT fu_period bigint, OUT fu_day bigint
)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(used) FILTER (WHERE span = 'period'), 0), coalesce(sum(used) FILTER (WHERE span = 'day'), 0),
           (SELECT coalesce(sum(used) FILTER (WHERE span = 'period'), 0) FROM user_feature_usage
             WHERE company_id = p_company AND user_id = p_user AND feature_id = p_feature
               AND ((span = 'period' AND starts_at = p_period_start) OR (span = 'day' AND starts_at = p_day_start))),
           (SELECT coalesce(sum(used) FILTER (WHERE span = 'day'), 0) FROM user_feature_usage
             WHERE company_id = p_company AND user_id = p_user AND feature_id = p_feature
               AND ((span = 'period' AND starts_at = p_period_start) OR (span = 'day' AND starts_at = p_day_start)))
      FROM company_feature_usage
     WHERE company_id = p_company AND feature_id = p_feature
       AND ((span = 'period' AND starts_at = p_period_start) OR (span = 'day' AND starts_at = p_day_start))
$$;
