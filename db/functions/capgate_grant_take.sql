-- Top-ups (SPEC §12): the company's grants that can pay for a call what its plan cannot hold,
-- for the admissions (capgate_charge, capgate_admit_batch). p_units: the part of the call's units
-- the company cap cannot hold (the call's units minus what is left under the cap; NULL: none
-- needed); p_micros: the part of the call's hold the company budget cannot hold (NULL: none
-- needed). The plan's company counter takes the rest of the call (the call is split; ledger
-- units_grant_part, cost_grant_part). Each part is paid by one grant: the grant with the earliest
-- expiry (then the oldest) that is not refunded, not expired at p_at, and has that much left (a
-- remainder smaller than the part is left for a smaller one: a part is not split again across
-- grants). Units and hold may come from two grants.
--
-- p_mode: 'peek' reads (no lock); 'lock' also locks the grants found (nothing changes, so a later
-- 'take' in the same transaction finds them again); 'take' locks and, when every grant needed was
-- found, draws on them (units_used, cost_held) and answers taken. Grants are locked after every
-- counter of the admission (the last lock it takes), as capgate_refund and capgate_settle_batch
-- take them last too.
CREATE FUNCTION capgate_grant_take(
    p_company uuid, p_at timestamptz, p_units bigint, p_micros bigint, p_mode text,
    OUT units_grant bigint, OUT cost_grant bigint, OUT taken boolean
)
LANGUAGE plpgsql
-- Key lookups only: never a sequential scan, never JIT (see capgate_admit_batch.sql).
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    taken := false;
    IF p_units IS NOT NULL THEN
        IF p_mode = 'peek' THEN
            SELECT g.id INTO units_grant FROM topup_grants g
             WHERE g.company_id = p_company AND g.refunded_at IS NULL AND g.expires_at > p_at
               AND g.units - g.units_used >= p_units
             ORDER BY g.expires_at, g.id LIMIT 1;
        ELSE
            SELECT g.id INTO units_grant FROM topup_grants g
             WHERE g.company_id = p_company AND g.refunded_at IS NULL AND g.expires_at > p_at
               AND g.units - g.units_used >= p_units
             ORDER BY g.expires_at, g.id LIMIT 1
               FOR UPDATE;
        END IF;
    END IF;
    IF p_micros IS NOT NULL THEN
        IF p_mode = 'peek' THEN
            SELECT g.id INTO cost_grant FROM topup_grants g
             WHERE g.company_id = p_company AND g.refunded_at IS NULL AND g.expires_at > p_at
               AND g.budget_micros - g.cost_used - g.cost_held >= p_micros
             ORDER BY g.expires_at, g.id LIMIT 1;
        ELSE
            SELECT g.id INTO cost_grant FROM topup_grants g
             WHERE g.company_id = p_company AND g.refunded_at IS NULL AND g.expires_at > p_at
               AND g.budget_micros - g.cost_used - g.cost_held >= p_micros
             ORDER BY g.expires_at, g.id LIMIT 1
               FOR UPDATE;
        END IF;
    END IF;
    IF p_mode = 'take' AND (p_units IS NULL OR units_grant IS NOT NULL) AND (p_micros IS NULL OR cost_grant IS NOT NULL) THEN
        IF units_grant IS NOT NULL THEN
            UPDATE topup_grants SET units_used = units_used + p_units WHERE company_id = p_company AND id = units_grant;
        END IF;
        IF cost_grant IS NOT NULL THEN
            UPDATE topup_grants SET cost_held = cost_held + p_micros WHERE company_id = p_company AND id = cost_grant;
        END IF;
        taken := true;
    END IF;
END;
$$;
