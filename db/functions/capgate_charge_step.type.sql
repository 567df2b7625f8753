-- What the steps of capgate_charge pass on to each other beside the call's capgate_admitted row.
--
-- hold: the hold as the counters take it (capgate_admitted.hold, 0 for none); rated: a rate window
-- or a concurrency limit applies. c_short, u_short: the company's, the user's budget cannot take
-- the hold (decided after the caps and the feature counters); c_hold: the part of the hold the
-- company budget takes (hold unless c_short). g_units: the company cap cannot hold the call, a
-- top-up grant can; g_part: the units past what the company cap has left, the grant's part.
-- units_grant, cost_grant: the grants locked, then taken, for the call's units and hold. scopes:
-- the rate window rows the call was counted in (capgate_rate.scopes).
CREATE TYPE capgate_charge_step AS (
    hold bigint, rated boolean, c_short boolean, u_short boolean, c_hold bigint, g_units boolean, g_part bigint,
    units_grant bigint, cost_grant bigint, scopes smallint
);
