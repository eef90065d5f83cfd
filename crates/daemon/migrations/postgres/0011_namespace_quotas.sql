-- A namespace's `--max-running` in a cluster: a claim counts the
-- namespace's claimed tasks (running, between attempts or stopping) under
-- a lock of the namespace, so that nodes claiming together take turns.
CREATE INDEX taskhost_claimed_ns ON taskhost_tasks (ns) WHERE state IN ('running', 'stopping');
-- A namespace's `--max-submit-rate` in a cluster: one token bucket per
-- namespace for every node's submissions (tokens left, as of `at_ms`).
CREATE TABLE taskhost_submit_rates (
    ns     TEXT   PRIMARY KEY,
    tokens FLOAT8 NOT NULL,
    at_ms  BIGINT NOT NULL
);
