-- Idempotency keys of the whole cluster (`host submit --idempotency-key`):
-- the task each made and the fingerprint (SHA-256) of its request. A key
-- is inserted first in the transaction that admits its task, so a second
-- node sending the same key waits for that transaction and then finds it.
CREATE TABLE taskhost_idempotency (
    key         text   PRIMARY KEY,
    task_id     bigint,
    fingerprint bytea  NOT NULL,
    created_ms  bigint NOT NULL
);
CREATE INDEX taskhost_idempotency_created ON taskhost_idempotency (created_ms);
