-- Step 3 of capgate_admit_batch: each call decided in arrival order against the counters
-- capgate_batch_lock and capgate_batch_lock_windows locked, moved in memory (the arrays are
-- returned as they end, for capgate_batch_write), exactly as capgate_charge decides one call.
-- A call whose key was refused is not decided; one capgate_batch_refusal refuses reaches no
-- counter (feature_not_in_plan's 402 still shows them as they stand, SPEC §3). Otherwise the caps,
-- the feature limits, then the budgets, in that order (SPEC §11: the hold, capgate_hold's); then
-- the rate windows of a call every counter takes (capgate_batch_rate). Top-ups (SPEC §12): a grant
-- that can pay what the company cap or budget cannot hold is locked when the call is decided
-- (capgate_grant_take, after every counter) and taken if the call is charged; the company counter
-- takes what is left under its cap and its budget's room, the grant the rest (gup units, gcp of the
-- hold), which stays off the company counter. A charge that brings a bounded counter to a
-- notification threshold (p_thresholds, the lowest p_low) writes its notification (capgate_notify).
CREATE FUNCTION capgate_batch_decide(
    p_calls capgate_batch_call[], p_wfc integer[], p_wfu integer[], p_thresholds integer[], p_low integer,
    INOUT c_rows capgate_batch_counter[], INOUT u_rows capgate_batch_counter[], INOUT fp_rows capgate_batch_counter[],
    INOUT fd_rows capgate_batch_counter[], INOUT up_rows capgate_batch_counter[], INOUT ud_rows capgate_batch_counter[],
    INOUT w_rows capgate_batch_counter[], OUT outcomes capgate_batch_outcome[]
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    c capgate_batch_call;
    o capgate_batch_outcome;
    vc capgate_batch_counter; vu capgate_batch_counter;  -- the call's company and user counters
    vfp capgate_batch_counter; vfd capgate_batch_counter; vup capgate_batch_counter; vud capgate_batch_counter;
    r record;
    u integer;
    h bigint;
    g_cap boolean; g_budget boolean; g_units bigint; g_cost bigint; g_taken boolean;
    g_up bigint; g_cp bigint;  -- the grant's parts of the call: units past the cap's rest, hold past the budget's room
BEGIN
    outcomes := '{}';
    FOR i IN 1..coalesce(cardinality(p_calls), 0) LOOP
        c := p_calls[i];
        o := NULL;
        o.rtok := c.rtok;
        <<decided>>
        BEGIN
            EXIT decided WHEN c.auth <> 'ok';
            o.decision := capgate_batch_refusal(c);
            IF o.decision = 'feature_not_in_plan' THEN
                vc := c_rows[c.cslot]; vu := u_rows[c.uslot];
                o.cused := vc.used; o.uused := vu.used;
                o.ccu := vc.cost_used; o.cch := vc.cost_held; o.ucu := vu.cost_used; o.uch := vu.cost_held;
            END IF;
            EXIT decided WHEN o.decision IS NOT NULL;
            vc := c_rows[c.cslot]; vu := u_rows[c.uslot];
            IF c.fps IS NOT NULL THEN
                vfp := fp_rows[c.fps]; vfd := fd_rows[c.fds]; vup := up_rows[c.ups]; vud := ud_rows[c.uds];
            END IF;
            u := c.units;
            h := CASE WHEN u > 0 THEN coalesce(c.hold, 0) ELSE 0 END;
            g_cap := u > 0 AND c.ccap IS NOT NULL AND vc.used + u > c.ccap;
            g_budget := u > 0 AND c.cbudget IS NOT NULL AND vc.cost_used + vc.cost_held + h > c.cbudget;
            g_units := NULL; g_cost := NULL;
            g_up := CASE WHEN g_cap THEN u - greatest(c.ccap - vc.used, 0) END;
            g_cp := CASE WHEN g_budget THEN h - greatest(c.cbudget - vc.cost_used - vc.cost_held, 0) END;
            IF g_cap OR g_budget THEN
                SELECT t.units_grant, t.cost_grant INTO g_units, g_cost FROM capgate_grant_take(c.company, c.at, g_up, g_cp, 'lock') t;
            END IF;
            IF u > 0 AND c.ccap IS NOT NULL AND vc.used + u > c.ccap AND g_units IS NULL THEN
                o.decision := 'company_cap';
            ELSIF u > 0 AND c.ucap IS NOT NULL AND vu.used + u > c.ucap THEN
                o.decision := 'user_cap';
            ELSIF c.fps IS NOT NULL AND c.lp IS NOT NULL AND vfp.used + u > c.lp THEN
                o.decision := 'feature_limit_exceeded'; o.refused := 'company.period';
            ELSIF c.fds IS NOT NULL AND c.ld IS NOT NULL AND vfd.used + u > c.ld THEN
                o.decision := 'feature_limit_exceeded'; o.refused := 'company.day';
            ELSIF c.ups IS NOT NULL AND c.lup IS NOT NULL AND vup.used + u > c.lup THEN
                o.decision := 'feature_limit_exceeded'; o.refused := 'user.period';
            ELSIF c.uds IS NOT NULL AND c.lud IS NOT NULL AND vud.used + u > c.lud THEN
                o.decision := 'feature_limit_exceeded'; o.refused := 'user.day';
            ELSIF u > 0 AND c.cbudget IS NOT NULL AND vc.cost_used + vc.cost_held + h > c.cbudget AND g_cost IS NULL THEN
                o.decision := 'budget_exceeded'; o.scope := 'company';
            ELSIF u > 0 AND c.ubudget IS NOT NULL AND vu.cost_used + vu.cost_held + h > c.ubudget THEN
                o.decision := 'budget_exceeded'; o.scope := 'user';
            ELSE
                o.decision := 'charged';
            END IF;
            o.rtok := NULL;
            IF o.decision = 'charged' AND u > 0
               AND coalesce(c.crpm, c.ctpm, c.urpm, c.utpm, c.uconc, c.fcrpm, c.fctpm, c.furpm, c.futpm, c.fconc) IS NOT NULL THEN
                -- The rate windows (SPEC §14), in memory; a refusal keeps the windows' new minutes.
                o.rtok := coalesce(c.rtok, 0);
                r := capgate_batch_rate(c, o, vc, vu, w_rows[p_wfc[i]], w_rows[p_wfu[i]]);
                o := r.o; vc := r.cc; vu := r.uc;
                IF p_wfc[i] IS NOT NULL THEN w_rows[p_wfc[i]] := r.wc; END IF;
                IF p_wfu[i] IS NOT NULL THEN w_rows[p_wfu[i]] := r.wu; END IF;
            END IF;
            IF o.decision = 'charged' THEN
                vc.used := vc.used + u; vu.used := vu.used + u;
                vc.cost_held := vc.cost_held + h; vu.cost_held := vu.cost_held + h;
                IF g_cap OR g_budget THEN
                    SELECT t.units_grant, t.cost_grant, t.taken INTO g_units, g_cost, g_taken
                      FROM capgate_grant_take(c.company, c.at, g_up, g_cp, 'take') t;
                    IF NOT g_taken THEN
                        RAISE EXCEPTION 'capgate_admit_batch: a top-up grant locked for call % was not found again', i;
                    END IF;
                    o.gu := g_units; o.gc := g_cost; o.gup := g_up; o.gcp := g_cp;
                    vc.used := vc.used - coalesce(g_up, 0);
                    vc.cost_held := vc.cost_held - coalesce(g_cp, 0);
                END IF;
                IF c.fps IS NOT NULL THEN
                    vfp.used := vfp.used + u; vfd.used := vfd.used + u; vup.used := vup.used + u; vud.used := vud.used + u;
                    o.fday := c.dstart;
                END IF;
                o.ledger := nextval('usage_ledger_id_seq'::regclass);
                -- Threshold notifications (SPEC §9), only for a counter at or past the lowest threshold.
                IF p_low IS NOT NULL AND u > 0 THEN
                    IF c.ccap IS NOT NULL AND vc.used * 100 >= p_low::bigint * c.ccap THEN
                        PERFORM capgate_notify(c.company, NULL, NULL, 'period', c.started_at, c.ends_at, vc.used, u, c.ccap,
                                               p_thresholds);
                    END IF;
                    IF c.ucap IS NOT NULL AND vu.used * 100 >= p_low::bigint * c.ucap THEN
                        PERFORM capgate_notify(c.company, c.user_id, NULL, 'period', c.started_at, c.ends_at, vu.used, u,
                                               c.ucap, p_thresholds);
                    END IF;
                    IF c.fps IS NOT NULL THEN
                        PERFORM capgate_notify(c.company, x.usr, c.feature, x.span, x.st, x.en, x.used, u, x.lim, p_thresholds)
                           FROM (VALUES (NULL::uuid, 'period', c.started_at, c.ends_at, vfp.used, c.lp),
                                        (NULL, 'day', c.dstart, c.dend, vfd.used, c.ld),
                                        (c.user_id, 'period', c.started_at, c.ends_at, vup.used, c.lup),
                                        (c.user_id, 'day', c.dstart, c.dend, vud.used, c.lud)) AS x(usr, span, st, en, used, lim)
                          WHERE x.lim IS NOT NULL AND x.used * 100 >= p_low::bigint * x.lim;
                    END IF;
                END IF;
            END IF;
            o.cused := vc.used; o.uused := vu.used;
            o.ccu := vc.cost_used; o.cch := vc.cost_held; o.ucu := vu.cost_used; o.uch := vu.cost_held;
            c_rows[c.cslot] := vc; u_rows[c.uslot] := vu;
            IF c.fps IS NOT NULL THEN
                o.fpu := vfp.used; o.fdu := vfd.used; o.upu := vup.used; o.udu := vud.used;
                fp_rows[c.fps] := vfp; fd_rows[c.fds] := vfd; up_rows[c.ups] := vup; ud_rows[c.uds] := vud;
            END IF;
        END;
        outcomes[i] := o;
    END LOOP;
END;
$$;
