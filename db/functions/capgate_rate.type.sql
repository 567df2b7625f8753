-- What capgate_rate_take decided for one call (SPEC §14).
--
-- refused: NULL (the call fits every window it has) or the window that refused it, the plan's
--   company-rpm | company-tpm | user-rpm | user-tpm | user-concurrency, then those of the call's
--   feature's entitlement, prefixed 'feature.' (checked in that order).
-- minute: the UTC minute the counts belong to. c_*: the company's window (calls, tokens), u_*:
--   the user's, u_slots: the user's calls in flight; fc_*, fu_*, fu_slots: the same for the
--   call's feature; with the call when it fits, as they stand when it does not (NULL where no
--   window of that owner is set).
-- scopes: the rows the call was counted in (1 the company's window, 2 the user's, 8 the
--   company's of the feature, 16 the user's of the feature; the caller adds 4 when it takes a
--   concurrency slot), 0 when refused.
CREATE TYPE capgate_rate AS (
    refused text, minute timestamptz, c_calls bigint, c_tokens bigint, u_calls bigint, u_tokens bigint,
    u_slots bigint, scopes smallint, fc_calls bigint, fc_tokens bigint, fu_calls bigint, fu_tokens bigint, fu_slots bigint
);
