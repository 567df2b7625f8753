-- What capgate_batch_decide decided for one call of a batch, beside its capgate_batch_call;
-- capgate_batch_write writes the charged ones, capgate_batch_answer answers every one.
--
-- decision: as capgate_admitted's (NULL for a call whose key was refused). ledger: the ledger id
-- of a charged call. refused: the feature limit that refused (capgate_admitted.feature_refused);
-- scope: the budget that refused (budget_scope). fday: the feature day a charged call counts in.
-- cused, uused, ccu, cch, ucu, uch: the company's and the user's unit counters and cost counters
-- (used, held), fpu, fdu, upu, udu: the feature counters, after the decision.
-- rtok: the tokens the call holds in the token windows (capgate_batch_call.rtok, or 0 for a call
-- counted without a bound; NULL for a call refused by a counter). Rate windows (SPEC §14): rref,
-- rmin, rscopes (the rows the call was counted in, as capgate_rate.scopes, with 4 for a
-- concurrency slot), the counts of the plan's windows (crc, crt, urc, urt, us) and of the
-- feature's (fcrc, fcrt, furc, furt, fus), as capgate_admitted's cr_*, ur_*, u_slots, fcr_*, fur_*,
-- fu_slots.
-- gu, gc: the top-up grants that paid the call's units and hold; gup, gcp: the parts they paid.
CREATE TYPE capgate_batch_outcome AS (
    decision text, ledger bigint, refused text, scope text, fday timestamptz,
    cused bigint, uused bigint, ccu bigint, cch bigint, ucu bigint, uch bigint,
    fpu bigint, fdu bigint, upu bigint, udu bigint,
    rtok bigint, rref text, rmin timestamptz, rscopes smallint,
    crc bigint, crt bigint, urc bigint, urt bigint, us bigint,
    fcrc bigint, fcrt bigint, furc bigint, furt bigint, fus bigint,
    gu bigint, gc bigint, gup bigint, gcp bigint
);
