-- The rate windows (SPEC §14) of one call of a batch that every counter took, decided in memory
-- for capgate_batch_decide as capgate_rate_take decides them: the owners in its order (company,
-- company x feature, user, user x feature); the first window that does not fit refuses the call
-- (rate_limited, o.rref naming the window), and the counts of the owners read so far stand as they
-- are; else every one takes the call, and a call with a concurrency limit takes a slot (o.rscopes
-- with 4). cc, uc: the call's company and user counter rows (the plan's windows); wc, wu: its
-- feature's window rows (capgate_batch_lock_windows), NULL where it has none. A plan counter row on
-- an earlier minute starts again, from what the periods before took in this minute when its period
-- started inside it (capgate_rate_carry); a feature row on an earlier minute from zero. o.rtok:
-- the call's tokens (0 without a bound).
CREATE FUNCTION capgate_batch_rate(
    c capgate_batch_call, INOUT o capgate_batch_outcome, INOUT cc capgate_batch_counter, INOUT uc capgate_batch_counter,
    INOUT wc capgate_batch_counter, INOUT wu capgate_batch_counter
)
LANGUAGE plpgsql
-- As every function of the admission path (see capgate_admit_batch.sql).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_minute timestamptz := date_trunc('minute', c.at, 'UTC');
    v_slot boolean := c.uconc IS NOT NULL OR c.fconc IS NOT NULL;
    v_scopes smallint := 0;
    v_ref text;
    v_rpm bigint; v_tpm bigint; v_conc bigint; v_c bigint; v_t bigint; v_s bigint;
    w capgate_batch_counter;
BEGIN
    o.rmin := v_minute;
    FOR k IN 1..4 LOOP
        v_rpm := (ARRAY[c.crpm, c.fcrpm, c.urpm, c.furpm])[k];
        v_tpm := (ARRAY[c.ctpm, c.fctpm, c.utpm, c.futpm])[k];
        v_conc := (ARRAY[NULL, NULL, c.uconc, c.fconc]::bigint[])[k];
        CONTINUE WHEN v_rpm IS NULL AND v_tpm IS NULL AND v_conc IS NULL;
        IF k = 1 THEN
            IF cc.rate_minute IS NULL OR cc.rate_minute < v_minute THEN
                SELECT x.calls, x.tokens INTO v_c, v_t FROM capgate_rate_carry(c.company, NULL, c.started_at, v_minute) x;
                cc.rate_minute := v_minute; cc.rate_calls := v_c; cc.rate_tokens := v_t;
            END IF;
            v_c := cc.rate_calls; v_t := cc.rate_tokens; v_s := NULL;
        ELSIF k = 3 THEN
            IF uc.rate_minute IS NULL OR uc.rate_minute < v_minute THEN
                SELECT x.calls, x.tokens INTO v_c, v_t FROM capgate_rate_carry(c.company, c.user_id, c.started_at, v_minute) x;
                uc.rate_minute := v_minute; uc.rate_calls := v_c; uc.rate_tokens := v_t;
            END IF;
            v_c := uc.rate_calls; v_t := uc.rate_tokens; v_s := uc.slots;
        ELSE
            w := CASE k WHEN 2 THEN wc ELSE wu END;
            v_c := CASE WHEN w.rate_minute >= v_minute THEN w.rate_calls ELSE 0 END;
            v_t := CASE WHEN w.rate_minute >= v_minute THEN w.rate_tokens ELSE 0 END;
            v_s := w.slots;
        END IF;
        v_ref := CASE WHEN v_rpm IS NOT NULL AND v_c + 1 > v_rpm THEN '-rpm'
                      WHEN v_tpm IS NOT NULL AND v_t + o.rtok > v_tpm THEN '-tpm'
                      WHEN v_conc IS NOT NULL AND v_s >= v_conc THEN '-concurrency' END;
        -- The owner's counts as they stand (the call is added below once every window took it).
        CASE k
            WHEN 1 THEN o.crc := v_c; o.crt := v_t;
            WHEN 2 THEN o.fcrc := v_c; o.fcrt := v_t;
            WHEN 3 THEN o.urc := v_c; o.urt := v_t;
                o.us := CASE WHEN v_conc IS NOT NULL AND coalesce(v_ref, '-concurrency') = '-concurrency' THEN v_s END;
            ELSE o.furc := v_c; o.furt := v_t;
                o.fus := CASE WHEN v_conc IS NOT NULL AND coalesce(v_ref, '-concurrency') = '-concurrency' THEN v_s END;
        END CASE;
        IF v_ref IS NOT NULL THEN
            o.decision := 'rate_limited';
            o.rref := (ARRAY['company', 'feature.company', 'user', 'feature.user'])[k] || v_ref;
            RETURN;
        END IF;
        v_scopes := v_scopes | (ARRAY[1, 8, 2, 16])[k];
    END LOOP;
    -- Taken: every window of the call moves, and a slot counts for the user's.
    IF (v_scopes & 1) <> 0 THEN
        o.crc := o.crc + 1; o.crt := o.crt + o.rtok;
        cc.rate_calls := cc.rate_calls + 1; cc.rate_tokens := cc.rate_tokens + o.rtok;
    END IF;
    IF (v_scopes & 8) <> 0 THEN o.fcrc := o.fcrc + 1; o.fcrt := o.fcrt + o.rtok; END IF;
    IF (v_scopes & 2) <> 0 THEN
        o.urc := o.urc + 1; o.urt := o.urt + o.rtok; o.us := o.us + 1;
        uc.rate_calls := uc.rate_calls + 1; uc.rate_tokens := uc.rate_tokens + o.rtok;
    END IF;
    IF (v_scopes & 16) <> 0 THEN o.furc := o.furc + 1; o.furt := o.furt + o.rtok; o.fus := o.fus + 1; END IF;
    IF v_slot THEN
        uc.slots := uc.slots + 1;
    END IF;
    IF wc.company_id IS NOT NULL THEN
        IF wc.rate_minute < v_minute THEN
            wc.rate_minute := v_minute; wc.rate_calls := 0; wc.rate_tokens := 0;
        END IF;
        wc.rate_calls := wc.rate_calls + 1; wc.rate_tokens := wc.rate_tokens + o.rtok;
        wc.slots := wc.slots + CASE WHEN v_slot THEN 1 ELSE 0 END; wc.moved := true;
    END IF;
    IF wu.company_id IS NOT NULL THEN
        IF wu.rate_minute < v_minute THEN
            wu.rate_minute := v_minute; wu.rate_calls := 0; wu.rate_tokens := 0;
        END IF;
        wu.rate_calls := wu.rate_calls + 1; wu.rate_tokens := wu.rate_tokens + o.rtok;
        wu.slots := wu.slots + CASE WHEN v_slot THEN 1 ELSE 0 END; wu.moved := true;
    END IF;
    o.rscopes := v_scopes | CASE WHEN v_slot THEN 4 ELSE 0 END;
END;
$$;
