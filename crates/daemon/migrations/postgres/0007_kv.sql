-- Key-value state of guests (`wasi:keyvalue`): a slot's bucket is
-- `slot:NAME`, a shared one `shared:NAME`. A write is made in a
-- transaction that holds its task's row (FOR SHARE) under the writer's
-- fencing token, so a node that lost its claim writes nothing.
CREATE TABLE taskhost_kv (
    scope TEXT  NOT NULL,
    key   TEXT  NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The bytes (keys and values) of every bucket together, for the
-- cluster's --kv-max-total; one row.
CREATE TABLE taskhost_kv_total (
    one   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    bytes BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO taskhost_kv_total DEFAULT VALUES;
