-- Top-ups split a call (SPEC §12, issue #29): "admission draws on grants only for what the plan's
-- company cap or budget cannot hold". A call that needs a grant is now paid in two parts: the
-- plan's company counter takes what it still holds, the grant (units_grant_id, cost_grant_id, as
-- before) only the rest.
--
-- units_grant_part: the call's units the grant paid (the company counter counts units minus it).
-- cost_grant_part: the part of the call's hold the grant held (the company counter held
-- hold_micros minus it). At settlement the plan pays first, up to its part of the hold, the grant
-- the rest (so a cost past the whole hold is the grant's): plan cost = least(cost_micros,
-- hold_micros - cost_grant_part), grant cost = cost_micros - plan cost.
--
-- NULL with its grant id set: the grant paid the whole (rows written before this migration, or by
-- the functions of the previous release in the moment before this release's functions replace
-- them); every reader takes coalesce(part, whole). No backfill and no CHECK: adding either would
-- read (or rewrite) the whole ledger under this migration's lock; the old rows mean what they say.
ALTER TABLE usage_ledger
    ADD COLUMN units_grant_part bigint,
    ADD COLUMN cost_grant_part bigint;
