-- Period k of an anchor is [anchor + k months, anchor + (k+1) months). PostgreSQL adds months
-- to a date by clamping to the last day of the target month, and every bound is computed from
-- the anchor (never chained), so an anchor on Jan 31 10:00 gives Feb 28/29 10:00, then Mar 31
-- 10:00. The calendar is UTC, whatever the session's time zone.
CREATE FUNCTION capgate_period_bound(p_anchor timestamptz, p_months integer) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET timezone = 'UTC' AS $$
    SELECT p_anchor + make_interval(months => p_months)
$$;
