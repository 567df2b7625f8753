-- Records the provider's status and token counts on a charge that stands. The charge itself was
-- committed durably by the admission; this informational write commits without waiting for the
-- WAL flush (a database crash can lose token counts of the last instant, never a charge).
CREATE FUNCTION capgate_settle(p_company uuid, p_ledger_id bigint, p_upstream_status integer,
                               p_input_tokens bigint, p_output_tokens bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    UPDATE usage_ledger
       SET upstream_status = p_upstream_status, input_tokens = p_input_tokens, output_tokens = p_output_tokens,
           settled_at = clock_timestamp()
     WHERE company_id = p_company AND id = p_ledger_id AND outcome = 'charged';
END;
$$;
