-- The plan a refused call's company could move to (SPEC §3 `upgrade`, §8 `feature_limit`), the
-- one place this choice is made: admissions answer it in their row, usage reads and
-- /v1/usage/check ask it directly.
--
-- For a cap (company_cap, user_cap) or no plan: the next active plan by sort order with a larger
-- company or user cap (NULL = unlimited counts as larger); from no plan, the first active plan.
-- For a feature (feature_not_in_plan, feature_limit_exceeded): the next active plan by sort order
-- that has the feature enabled and, when a window refused (p_refused, `<scope>.<window>`, with its
-- limit p_refused_limit), a larger limit in that window, which comes back as feature_limit.
-- Any other decision: no row.
CREATE FUNCTION capgate_upgrade_offer(
    p_decision text, p_plan text, p_feature text, p_refused text, p_refused_limit bigint
) RETURNS TABLE (plan_id text, company_cap bigint, user_cap bigint, feature_limit bigint)
LANGUAGE sql STABLE AS $$
    (SELECT n.id, n.monthly_company_cap, n.monthly_user_cap, NULL::bigint
       FROM plans n LEFT JOIN plans c ON c.id = p_plan
      WHERE p_decision IN ('company_cap', 'user_cap', 'no_active_plan')
        AND n.is_active AND n.id IS DISTINCT FROM c.id
        AND (c.id IS NULL OR (n.sort_order > c.sort_order AND (
               (c.monthly_company_cap IS NOT NULL AND (n.monthly_company_cap IS NULL OR n.monthly_company_cap > c.monthly_company_cap))
            OR (c.monthly_user_cap IS NOT NULL AND (n.monthly_user_cap IS NULL OR n.monthly_user_cap > c.monthly_user_cap)))))
      ORDER BY n.sort_order, n.id
      LIMIT 1)
    UNION ALL
    (SELECT n.id, n.monthly_company_cap, n.monthly_user_cap, w.lim
       FROM plans n
       JOIN plan_features e ON e.plan_id = n.id AND e.feature_id = p_feature AND e.enabled
       CROSS JOIN LATERAL (
           SELECT CASE p_refused WHEN 'company.period' THEN e.period_limit WHEN 'company.day' THEN e.daily_limit
                                 WHEN 'user.period' THEN e.user_period_limit WHEN 'user.day' THEN e.user_daily_limit END
       ) AS w(lim)
       LEFT JOIN plans c ON c.id = p_plan
      WHERE p_decision IN ('feature_not_in_plan', 'feature_limit_exceeded')
        AND n.is_active AND n.id IS DISTINCT FROM c.id AND (c.id IS NULL OR n.sort_order > c.sort_order)
        AND (p_refused IS NULL OR coalesce(w.lim, 9223372036854775807) > coalesce(p_refused_limit, -1))
      ORDER BY n.sort_order, n.id
      LIMIT 1)
$$;
