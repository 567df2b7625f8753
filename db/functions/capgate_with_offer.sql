-- An admission row with its refusal's upgrade offer filled in (capgate_upgrade_offer); a row
-- that is not such a refusal comes back as it is.
CREATE FUNCTION capgate_with_offer(r capgate_admitted) RETURNS capgate_admitted
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF r.decision IN ('company_cap', 'user_cap', 'no_active_plan', 'feature_not_in_plan', 'feature_limit_exceeded') THEN
        SELECT o.plan_id, o.company_cap, o.user_cap, o.feature_limit
          INTO r.upgrade_plan, r.upgrade_company_cap, r.upgrade_user_cap, r.upgrade_feature_limit
          FROM capgate_upgrade_offer(r.decision, r.plan_id, r.feature_id, r.feature_refused,
                                     CASE r.feature_refused WHEN 'company.period' THEN r.fc_period_limit
                                                            WHEN 'company.day' THEN r.fc_day_limit
                                                            WHEN 'user.period' THEN r.fu_period_limit
                                                            WHEN 'user.day' THEN r.fu_day_limit END) o;
    END IF;
    RETURN r;
END;
$$;
