-- The price in force for p_model at p_at (SPEC §11): among the rows whose model is p_model
-- itself or a prefix of it written with a trailing `*`, and whose effective_from <= p_at, the most
-- specific model (the exact id before any prefix, a longer prefix before a shorter one), and of
-- its rows the latest effective_from. No row: no price (an empty result).
--
-- On the admission's path, so it is a bounded index read: the candidate patterns are p_model and
-- its length + 1 prefixes with `*` (`c*`, `cl*`, …, and `*` alone), each one probe of the primary
-- key's index (model, effective_from) in a single index scan; only the rows of those models up to
-- p_at are read, then the best one is kept. A future row never hides one in force.
CREATE FUNCTION capgate_price(p_model text, p_at timestamptz) RETURNS SETOF prices
LANGUAGE sql STABLE PARALLEL SAFE ROWS 1 AS $$
    SELECT p.*
      FROM prices p
     WHERE p.model = ANY (
               array_append(ARRAY(SELECT left(p_model, n) || '*' FROM generate_series(0, length(p_model)) AS n),
                            p_model))
       AND p.effective_from <= p_at
     ORDER BY p.model = p_model DESC, length(p.model) DESC, p.effective_from DESC
     LIMIT 1
$$;
