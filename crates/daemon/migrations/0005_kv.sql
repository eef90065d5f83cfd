-- Key-value state of guests (`wasi:keyvalue`): a slot's bucket is
-- `slot:NAME`, a shared one `shared:NAME`. Each write a guest makes is
-- committed before its host call returns.
CREATE TABLE kv (
    scope TEXT NOT NULL,
    key   TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
