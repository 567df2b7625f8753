-- A user id is unique within its company, not across companies (SPEC §5): the same identity-
-- provider id in two companies is two users, and no answer tells one company whether an id
-- exists in another. Until now `users.id` carried a UNIQUE constraint of its own beside the
-- primary key (company_id, id): a create in company A answered 409 "a user with id … already
-- exists" when company B had that id (telling A about B), and A could claim a person's id first
-- so that B could not add them. Every table that names a user does so with its company
-- (api_keys, the usage counters, idempotency keys, rate windows), so only the extra constraint
-- goes.
ALTER TABLE users DROP CONSTRAINT IF EXISTS users_id_key;
