-- The midnight in p_zone that starts the day containing p_at, and the next one: PostgreSQL's
-- zone rules make a day 23 or 25 hours long across a DST change.
CREATE FUNCTION capgate_day_start(p_at timestamptz, p_zone text) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT date_trunc('day', p_at, p_zone)
$$;

CREATE FUNCTION capgate_day_end(p_at timestamptz, p_zone text) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT ((date_trunc('day', p_at, p_zone) AT TIME ZONE p_zone) + interval '1 day') AT TIME ZONE p_zone
$$;
