-- Named deployments (`host deploy`, `host rollback`), the same for every
-- node: every deploy, rollback and removal of a version, in order. `prev`
-- is the seq of the name's event before this one (0 for its first), unique
-- per name, so that two nodes deciding on the same events cannot both
-- append.
CREATE TABLE taskhost_deployments (
    seq     BIGSERIAL PRIMARY KEY,
    name    TEXT NOT NULL,
    prev    BIGINT NOT NULL,
    version TEXT NOT NULL,
    digest  BYTEA NOT NULL,
    at_ms   BIGINT NOT NULL,
    what    TEXT NOT NULL,
    UNIQUE (name, prev)
);
