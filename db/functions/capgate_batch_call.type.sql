-- One call of a batch as capgate_batch_read found it (step 1 of capgate_admit_batch): what the
-- gateway sent, who makes it, its period, plan, feature and entitlement, and where its counters
-- are in the arrays capgate_batch_lock fills. Read once, never changed after.
--
-- ord: its place in the batch (1-based). model, feature: NULL when absent. prompt, max_tokens:
--   its cost bound as given (capgate_hold). auth: capgate_key_check's answer; the rest is NULL
--   for a call whose key was not found.
-- user_ok: the user exists and is not disabled. stale: matched against an older route table.
-- ccap, ucap: the company's and the user's caps; cbudget, ubudget: their budgets (NULL: none).
-- cslot, uslot: the call's company and user counters (their index in capgate_batch_lock's arrays),
--   NULL when the call reaches no counter; fps, fds, ups, uds: its company feature period and day
--   counters, its user feature period and day counters, NULL when it counts in no feature.
-- factive, fenabled: the feature exists and is active, the plan includes it (fmsg: the plan's
--   message); bound: an API key bound to features (api_keys.features) may be charged to it.
-- lp, ld, lup, lud: the entitlement's limits (company period and day, user period and day);
--   dstart, dend: the feature day that holds the call (in the company's time zone).
-- priced: the call's model has a price; hold: capgate_hold's; rtok: capgate_rate_tokens'.
-- crpm, ctpm, urpm, utpm, uconc: the plan's rate windows and concurrency (SPEC §14); fcrpm, fctpm,
--   furpm, futpm, fconc: the entitlement's.
CREATE TYPE capgate_batch_call AS (
    ord integer, at timestamptz, units integer, method text, route text, model text, feature text,
    request_id text, prompt bigint, max_tokens bigint,
    auth text, company uuid, user_id uuid, role text, user_ok boolean, stale boolean,
    period bigint, plan text, plan_name text, started_at timestamptz, ends_at timestamptz,
    ccap bigint, ucap bigint, cbudget bigint, ubudget bigint,
    cslot integer, uslot integer, fps integer, fds integer, ups integer, uds integer,
    fname text, factive boolean, fenabled boolean, fmsg text, bound boolean,
    lp bigint, ld bigint, lup bigint, lud bigint, dstart timestamptz, dend timestamptz,
    priced boolean, hold bigint, rtok bigint,
    crpm integer, ctpm bigint, urpm integer, utpm bigint, uconc integer,
    fcrpm integer, fctpm bigint, furpm integer, futpm bigint, fconc integer
);
