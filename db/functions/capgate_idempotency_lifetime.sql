-- How long an Idempotency-Key is remembered.
CREATE FUNCTION capgate_idempotency_lifetime() RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT interval '24 hours' $$;

