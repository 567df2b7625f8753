-- Step 5 of capgate_admit_batch: one capgate_admitted row per call, in the order given, from what
-- capgate_batch_read found and capgate_batch_decide decided; a refusal's upgrade offer
-- (capgate_upgrade_offer) with it, so a 402 needs no second round trip. Who made a call (company,
-- user, role) is answered only when its key was accepted.
CREATE FUNCTION capgate_batch_answer(
    p_calls capgate_batch_call[], p_outcomes capgate_batch_outcome[]
) RETURNS SETOF capgate_admitted
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
        SELECT c.ord, c.auth, CASE WHEN c.auth = 'ok' THEN c.company END, CASE WHEN c.auth = 'ok' THEN c.user_id END,
               CASE WHEN c.auth = 'ok' THEN c.role END, o.decision, o.ledger, c.period, c.plan, c.plan_name,
               c.started_at, c.ends_at, o.cused, c.ccap, o.uused, c.ucap,
               c.feature, c.fname, o.refused, c.fmsg, c.dstart, c.dend,
               o.fpu, c.lp, o.fdu, c.ld, o.upu, c.lup, o.udu, c.lud,
               NULL::integer, NULL::text, NULL::bytea, x.plan_id, x.company_cap, x.user_cap, x.feature_limit,
               CASE WHEN o.decision IN ('charged', 'company_cap', 'user_cap', 'feature_limit_exceeded', 'budget_exceeded',
                                        'rate_limited')
                    THEN c.hold END,
               o.scope, o.ccu, o.cch, c.cbudget, o.ucu, o.uch, c.ubudget,
               o.rref, o.rmin, o.rtok, c.crpm, c.ctpm, c.urpm, c.utpm, c.uconc, o.crc, o.crt, o.urc, o.urt, o.us,
               c.fcrpm, c.fctpm, c.furpm, c.futpm, c.fconc, o.fcrc, o.fcrt, o.furc, o.furt, o.fus
          FROM unnest(p_calls) WITH ORDINALITY c JOIN unnest(p_outcomes) WITH ORDINALITY o ON o.ordinality = c.ordinality
          -- A refusal's upgrade offer (the one-time filter skips the lookup for every other call).
          LEFT JOIN LATERAL (
              SELECT * FROM capgate_upgrade_offer(o.decision, c.plan, c.feature, o.refused,
                                                  CASE o.refused WHEN 'company.period' THEN c.lp WHEN 'company.day' THEN c.ld
                                                                 WHEN 'user.period' THEN c.lup WHEN 'user.day' THEN c.lud END)
               WHERE o.decision IN ('company_cap', 'user_cap', 'no_active_plan', 'feature_not_in_plan',
                                    'feature_limit_exceeded')
          ) x ON true
         ORDER BY c.ordinality;
END;
$$;
