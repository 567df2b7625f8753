-- What one admission decided, as every admission function answers it (one row per call).
--
-- decision: charged | company_cap | user_cap | no_active_plan | unknown_user | unknown_feature |
--   feature_not_bound (a key bound to other features) | feature_not_in_plan |
--   feature_limit_exceeded | stale_routes (the call was matched against an
--   older route table: nothing changed, match again) | idempotency_replay | idempotency_in_flight
--   | idempotency_not_kept | idempotency_mismatch | budget_exceeded (SPEC §11, after every cap and
--   feature counter) | unpriced_model | max_tokens_required | unbounded_call (a budget applies and
--   the call cannot be held: no price for its model, no max_tokens, or a body the price book cannot
--   bound; all three 400, nothing changed; the same two where a token window applies, SPEC §14) |
--   rate_limited (SPEC §14, after the budgets: rate_refused names the window).
-- auth: capgate_key_check's answer, ok | unknown_key | revoked_key | expired_key |
--   disabled_user (everything after role is NULL unless ok).
-- feature_refused: the limit that refused, company.period | company.day | user.period | user.day.
-- fc_*: the company's feature counters, fu_*: the user's (used after the call, and the limit).
-- upgrade_*: a refusal's upgrade offer (capgate_upgrade_offer), so a 402 needs no second round trip.
-- hold: the call's worst-case cost in micro-dollars (capgate_hold; NULL: nothing held), held in
--   cc_held / uc_held when it was charged. budget_scope: company | user, on budget_exceeded.
-- cc_*: the company's cost counters (used, held) and budget, uc_*: the user's (NULL budget:
--   unlimited), as they stand after the decision.
-- Rate windows (SPEC §14), for a metered call that reached them: rate_refused (the window of a
--   rate_limited decision: company-rpm | company-tpm | user-rpm | user-tpm | user-concurrency),
--   rate_minute (the UTC minute counted in), rate_tokens (what the call holds in the token
--   windows), the plan's limits (NULL: none), the counts of the company's window (cr_*), the
--   user's (ur_*) and the user's calls in flight (u_slots), with the call or as they stand; the
--   same for the call's feature where its entitlement sets limits (f_* limits, fcr_*, fur_*,
--   fu_slots; a refusing feature window is named 'feature.<window>').
CREATE TYPE capgate_admitted AS (
    item integer, auth text, company_id uuid, user_id uuid, role text,
    decision text, ledger_id bigint, period_id bigint, plan_id text, plan_name text,
    period_start timestamptz, period_end timestamptz, company_used bigint, company_cap bigint,
    user_used bigint, user_cap bigint,
    feature_id text, feature_name text, feature_refused text, feature_message text,
    day_start timestamptz, day_end timestamptz,
    fc_period_used bigint, fc_period_limit bigint, fc_day_used bigint, fc_day_limit bigint,
    fu_period_used bigint, fu_period_limit bigint, fu_day_used bigint, fu_day_limit bigint,
    answer_status integer, answer_type text, answer_body bytea,
    upgrade_plan text, upgrade_company_cap bigint, upgrade_user_cap bigint, upgrade_feature_limit bigint,
    hold bigint, budget_scope text, cc_used bigint, cc_held bigint, cc_limit bigint,
    uc_used bigint, uc_held bigint, uc_limit bigint,
    rate_refused text, rate_minute timestamptz, rate_tokens bigint, company_rpm integer, company_tpm bigint,
    user_rpm integer, user_tpm bigint, user_concurrency integer, cr_calls bigint, cr_tokens bigint,
    ur_calls bigint, ur_tokens bigint, u_slots bigint,
    f_company_rpm integer, f_company_tpm bigint, f_user_rpm integer, f_user_tpm bigint, f_user_concurrency integer,
    fcr_calls bigint, fcr_tokens bigint, fur_calls bigint, fur_tokens bigint, fu_slots bigint
);
