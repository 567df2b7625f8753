-- Whole months of the ledger written to a file (`capgate ledger export`, issue #50 item 2): one
-- row per month and format, replaced by a later export of the same month in the same format.
-- Retention (`ledger.retentionMonths`, SPEC §7) drops no month without a row here. The month is
-- UTC: the rows of usage_ledger with created_at in [month, month + 1 month) at UTC.
--
-- rows: how many ledger rows the file holds; bytes and sha256: the file's size and the SHA-256
-- of its bytes (lower-case hex, as `sha256sum` prints it); path: where it was written, absolute,
-- as the exporting host saw it.
CREATE TABLE ledger_exports (
    month date NOT NULL CHECK (extract(day FROM month) = 1),
    format text NOT NULL CHECK (format IN ('jsonl', 'csv')),
    rows bigint NOT NULL CHECK (rows >= 0),
    bytes bigint NOT NULL CHECK (bytes >= 0),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    path text NOT NULL,
    exported_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (month, format)
);
