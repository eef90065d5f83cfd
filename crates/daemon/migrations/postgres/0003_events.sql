-- Every node's lifecycle events (postcard-encoded `Event`s), shipped in
-- batches, so that `host events` on any node shows the whole cluster's.
-- Best-effort like every event stream; each node prunes the oldest beyond
-- a bound.
CREATE TABLE taskhost_events (
    seq   BIGSERIAL PRIMARY KEY,
    node  BIGINT    NOT NULL,
    event BYTEA     NOT NULL
);

-- Plugin collection asks whether any task still refers to a plugin.
CREATE INDEX taskhost_digests ON taskhost_tasks (digest);
