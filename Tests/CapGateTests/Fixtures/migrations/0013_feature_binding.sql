-- Who picks the feature (SPEC §8). Tables only: the admission functions that read these columns
-- live in db/functions/.
--
-- routes.header_features: the only features a route's CapGate-Feature header may name (NULL:
-- any active feature, as before; another is 400). api_keys.features: the features a key may be
-- charged to (NULL: unbound, as before; a call whose route or header names another is 403,
-- nothing charged). Feature ids are checked against `features` when written (features are
-- never deleted, only made inactive).
ALTER TABLE routes ADD COLUMN header_features text[]
    CHECK (cardinality(header_features) <= 100 AND array_position(header_features, NULL) IS NULL);
ALTER TABLE api_keys ADD COLUMN features text[]
    CHECK (cardinality(features) <= 100 AND array_position(features, NULL) IS NULL);
