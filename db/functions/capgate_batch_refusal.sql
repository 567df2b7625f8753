-- Why a call of a batch whose key was accepted is refused before any counter, NULL when it
-- reaches them, checked in this order: stale_routes (matched against an older route table),
-- no_active_plan, unknown_user (unknown or disabled), unknown_feature (unknown or inactive),
-- feature_not_bound (its key is bound to other features), feature_not_in_plan; then a metered call
-- that cannot be bounded where it must be (SPEC §11: fail closed), where a budget applies
-- (unbounded_call: a body the price book cannot bound; unpriced_model; max_tokens_required), then
-- where a token window applies (SPEC §14: the same three, a call without a token bound otherwise
-- unbounded_call). Decided from the call alone (capgate_batch_read), so capgate_batch_decide asks it
-- first. A plain SQL expression without settings, so a caller's expression inlines it (no call).
CREATE FUNCTION capgate_batch_refusal(c capgate_batch_call) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN c.stale THEN 'stale_routes'
                WHEN c.period IS NULL THEN 'no_active_plan'
                WHEN NOT c.user_ok THEN 'unknown_user'
                WHEN c.feature IS NOT NULL AND NOT coalesce(c.factive, false) THEN 'unknown_feature'
                WHEN NOT c.bound THEN 'feature_not_bound'
                WHEN c.feature IS NOT NULL AND NOT coalesce(c.fenabled, false) THEN 'feature_not_in_plan'
                WHEN c.units > 0 AND (c.cbudget IS NOT NULL OR c.ubudget IS NOT NULL)
                     AND (NOT c.priced OR c.prompt < -1 OR c.max_tokens < 0)
                    THEN CASE WHEN c.prompt < -1 THEN 'unbounded_call' WHEN NOT c.priced THEN 'unpriced_model'
                              ELSE 'max_tokens_required' END
                WHEN c.units > 0 AND (c.rtok IS NULL OR NOT c.priced)
                     AND (c.ctpm IS NOT NULL OR c.utpm IS NOT NULL OR c.fctpm IS NOT NULL OR c.futpm IS NOT NULL)
                    THEN CASE WHEN c.prompt < -1 THEN 'unbounded_call' WHEN NOT c.priced THEN 'unpriced_model'
                              WHEN c.max_tokens < 0 THEN 'max_tokens_required' ELSE 'unbounded_call' END
           END
$$;
