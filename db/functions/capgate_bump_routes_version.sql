-- Every change to routes bumps config_versions.routes (trigger routes_bump_version, 0011): an
-- admission matched against an older route table is answered stale_routes and matched again.
CREATE OR REPLACE FUNCTION capgate_bump_routes_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE config_versions SET routes = routes + 1 WHERE singleton;
    RETURN NULL;
END;
$$;
