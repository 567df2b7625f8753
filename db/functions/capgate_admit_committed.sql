-- capgate_admit as a procedure that commits before it answers: the single call's admission
-- acknowledged in its own round trip (issue #46). A statement in an implicit transaction answers
-- before its commit (which comes at the Sync that follows, and with synchronous replication waits
-- for the standby), so a function's answer is not a commit, and the gateway used to send a
-- second statement on the connection as the proof. A procedure's COMMIT is a real commit, with
-- its wait for the synchronous standby, and the CALL's row (the OUT parameters) is sent only
-- after it: when the row arrives the charge is on the standby (or, with database.durability =
-- relaxed, in the primary's WAL, as before). A primary stopped during the wait ends the
-- connection (57P01) with no row: the outcome is unknown and the charge is given back if it
-- stands, as for every write. Only the implicit transaction of a CALL may commit inside it: never
-- call it in a transaction block.
--
-- The parameters are capgate_admit's; the OUT parameters are capgate_admitted's columns, in its
-- order (the gateway reads the row by position, db/functions/capgate_admission.type.sql).
CREATE PROCEDURE capgate_admit_committed(
    p_key_hash bytea, p_company uuid, p_user uuid, p_units integer, p_method text, p_route text, p_model text,
    p_feature text, p_request_id text, p_routes_version bigint, p_at timestamptz, p_relaxed boolean,
    p_prompt bigint, p_max_tokens bigint, p_cache smallint, p_window bigint, p_ended bigint[],
    OUT item integer, OUT auth text, OUT company_id uuid, OUT user_id uuid, OUT role text, OUT decision text,
    OUT ledger_id bigint, OUT period_id bigint, OUT plan_id text, OUT plan_name text, OUT period_start timestamptz,
    OUT period_end timestamptz, OUT company_used bigint, OUT company_cap bigint, OUT user_used bigint,
    OUT user_cap bigint, OUT feature_id text, OUT feature_name text, OUT feature_refused text,
    OUT feature_message text, OUT day_start timestamptz, OUT day_end timestamptz, OUT fc_period_used bigint,
    OUT fc_period_limit bigint, OUT fc_day_used bigint, OUT fc_day_limit bigint, OUT fu_period_used bigint,
    OUT fu_period_limit bigint, OUT fu_day_used bigint, OUT fu_day_limit bigint, OUT answer_status integer,
    OUT answer_type text, OUT answer_body bytea, OUT upgrade_plan text, OUT upgrade_company_cap bigint,
    OUT upgrade_user_cap bigint, OUT upgrade_feature_limit bigint, OUT hold bigint, OUT budget_scope text,
    OUT cc_used bigint, OUT cc_held bigint, OUT cc_limit bigint, OUT uc_used bigint, OUT uc_held bigint,
    OUT uc_limit bigint, OUT rate_refused text, OUT rate_minute timestamptz, OUT rate_tokens bigint,
    OUT company_rpm integer, OUT company_tpm bigint, OUT user_rpm integer, OUT user_tpm bigint,
    OUT user_concurrency integer, OUT cr_calls bigint, OUT cr_tokens bigint, OUT ur_calls bigint,
    OUT ur_tokens bigint, OUT u_slots bigint, OUT f_company_rpm integer, OUT f_company_tpm bigint,
    OUT f_user_rpm integer, OUT f_user_tpm bigint, OUT f_user_concurrency integer, OUT fcr_calls bigint,
    OUT fcr_tokens bigint, OUT fur_calls bigint, OUT fur_tokens bigint, OUT fu_slots bigint
)
LANGUAGE plpgsql
AS $$
BEGIN
    SELECT *
      INTO item, auth, company_id, user_id, role, decision, ledger_id, period_id, plan_id, plan_name, period_start,
           period_end, company_used, company_cap, user_used, user_cap, feature_id, feature_name, feature_refused,
           feature_message, day_start, day_end, fc_period_used, fc_period_limit, fc_day_used, fc_day_limit,
           fu_period_used, fu_period_limit, fu_day_used, fu_day_limit, answer_status, answer_type, answer_body,
           upgrade_plan, upgrade_company_cap, upgrade_user_cap, upgrade_feature_limit, hold, budget_scope, cc_used,
           cc_held, cc_limit, uc_used, uc_held, uc_limit, rate_refused, rate_minute, rate_tokens, company_rpm,
           company_tpm, user_rpm, user_tpm, user_concurrency, cr_calls, cr_tokens, ur_calls, ur_tokens, u_slots,
           f_company_rpm, f_company_tpm, f_user_rpm, f_user_tpm, f_user_concurrency, fcr_calls, fcr_tokens,
           fur_calls, fur_tokens, fu_slots
      FROM capgate_admit(p_key_hash, p_company, p_user, p_units, p_method, p_route, p_model, p_feature, p_request_id,
                         p_routes_version, p_at, p_relaxed, p_prompt, p_max_tokens, p_cache, p_window, p_ended);
    COMMIT;
    -- A commit's wait for the synchronous standby, cut short, is still a commit, local only:
    -- PostgreSQL warns "canceling wait for synchronous replication" and goes on. Inside a CALL
    -- the statement's statement_timeout (database.timeout) is armed during the COMMIT (unlike
    -- the commit at a Sync, which no timeout ends), so a standby slower than database.timeout
    -- would let this row go out for a charge the standby may never get. When the CALL has run
    -- as long as its timeout, the wait may have been cut: the row is withheld and the outcome
    -- reported unknown (SQLSTATE CG001, taken as a lost connection: the charge is given back if
    -- it stands). A pg_cancel_backend during the wait is the one cut this cannot see, as the
    -- Sync's commit cannot (docs/design-notes.md). A commit that waits for no standby (none
    -- named, or relaxed durability: synchronous_commit off for that transaction only, so read
    -- from p_relaxed) had no wait to cut: its row is answered, late or not.
    IF NOT p_relaxed AND current_setting('synchronous_standby_names') <> ''
       AND current_setting('synchronous_commit') NOT IN ('off', 'local')
       AND current_setting('statement_timeout')::interval > interval '0'
       AND clock_timestamp() - statement_timestamp() >= current_setting('statement_timeout')::interval THEN
        RAISE EXCEPTION 'the admission committed, but its synchronous wait may have been cut by statement_timeout'
            USING ERRCODE = 'CG001';
    END IF;
END;
$$;
