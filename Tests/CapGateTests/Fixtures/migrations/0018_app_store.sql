-- App Store Server Notifications V2 and StoreKit 2 transactions (SPEC §12).

-- Every verified notification, once per notificationUUID (Apple retries and repeats them), with
-- what was done: applied, stale (signed before the last one applied for its original
-- transaction), kept (a downgrade, applied at the next renewal), stored (TEST, one-time
-- charges, types CapGate does not apply), unmatched (no company), failed (see detail).
-- company_id NULL: unmatched, listed for the operator. The payload is the decoded, verified
-- notification with its nested transaction and renewal info (never the raw JWS).
CREATE TABLE apple_notifications (
    notification_uuid text PRIMARY KEY CHECK (length(notification_uuid) BETWEEN 1 AND 100),
    company_id uuid REFERENCES companies (id),
    notification_type text NOT NULL,
    subtype text,
    environment text NOT NULL,
    signed_at timestamptz NOT NULL,
    original_transaction_id text,
    transaction_id text,
    product_id text,
    outcome text NOT NULL CHECK (outcome IN ('applied', 'stale', 'kept', 'stored', 'unmatched', 'failed')),
    detail text,
    payload jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_notifications_unmatched ON apple_notifications (received_at) WHERE company_id IS NULL;

-- The company an App Store subscription (its originalTransactionId) belongs to, and the
-- signedDate of the last notification applied for it (out-of-order deliveries are not applied).
CREATE TABLE apple_transactions (
    original_transaction_id text PRIMARY KEY CHECK (length(original_transaction_id) BETWEEN 1 AND 100),
    company_id uuid NOT NULL REFERENCES companies (id),
    last_applied_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_transactions_company ON apple_transactions (company_id);
