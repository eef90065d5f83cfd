-- Idempotency keys (`host submit --idempotency-key`): the task each made
-- and the fingerprint (SHA-256) of the request it was given with, written
-- in the same transaction as that task's row. Kept for the daemon's
-- `idempotency_retention` from `created_ms`, independently of the task's
-- own retention.
CREATE TABLE idempotency (
    key         TEXT    PRIMARY KEY,
    task_id     INTEGER NOT NULL,
    fingerprint BLOB    NOT NULL,
    created_ms  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX idempotency_created ON idempotency (created_ms);
