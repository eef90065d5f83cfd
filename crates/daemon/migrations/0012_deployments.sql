-- Named deployments (`host deploy`, `host rollback`): every deploy,
-- rollback and removal of a version, in order. A name's versions and its
-- current one are what its rows come to (service/deployments.rs).
CREATE TABLE deployments (
    seq     INTEGER PRIMARY KEY,
    name    TEXT NOT NULL,
    version TEXT NOT NULL,
    digest  BLOB NOT NULL,
    at_ms   INTEGER NOT NULL,
    what    TEXT NOT NULL
);
