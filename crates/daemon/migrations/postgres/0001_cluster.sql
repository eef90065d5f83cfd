-- Cluster mode: several `host serve --store postgres://…` nodes share one
-- database. Every decision that two nodes could race on is one transaction
-- here; the rows below are the whole shared state.

-- A node is one `host serve` process. It renews `lease_until` (the
-- database's clock, so the nodes' clocks never matter); once it is past,
-- any live node marks it dead and takes its work over.
CREATE TABLE taskhost_nodes (
    id          BIGSERIAL   PRIMARY KEY,
    name        TEXT        NOT NULL,
    started_ms  BIGINT      NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL,
    alive       BOOLEAN     NOT NULL DEFAULT TRUE,
    capacity    INTEGER     NOT NULL
);

-- Task ids: strictly increasing, never reused, across every node.
CREATE SEQUENCE taskhost_task_ids;
-- Fencing tokens: each claim of a task takes a new one, so within a slot
-- they only grow; every later write of the claimed attempt names its token.
CREATE SEQUENCE taskhost_fence;

-- One row per slot ever used: its row lock serialises admission and
-- release in that slot (never a count checked and then written).
CREATE TABLE taskhost_slots (
    slot TEXT PRIMARY KEY
);

-- Every accepted submission. `request` is the submission as resolved
-- (name, slot and policy filled in), postcard-encoded; `report` and `log`
-- the final report and the guest's lines, postcard-encoded.
--   queued   waits in its slot's queue (`pos` orders it)
--   ready    owns its slot, waits for a node to claim it
--   running  claimed by `node` under `token` (an attempt runs, or it
--            pauses until `resume_at_ms` before the next)
--   stopping claimed, and asked to stop (cancel, remove, replace)
--   finished has its outcome
CREATE TABLE taskhost_tasks (
    id           BIGINT  PRIMARY KEY,
    name         TEXT    NOT NULL,
    slot         TEXT    NOT NULL,
    plugin       TEXT    NOT NULL,
    digest       BYTEA   NOT NULL,
    request      BYTEA   NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('queued', 'ready', 'running', 'stopping', 'finished')),
    pos          BIGINT  NOT NULL DEFAULT 0,
    placed       BOOLEAN NOT NULL DEFAULT TRUE,
    node         BIGINT,
    token        BIGINT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    failures     INTEGER NOT NULL DEFAULT 0,
    resume_at_ms BIGINT,
    submitted_ms BIGINT  NOT NULL,
    finished_ms  BIGINT,
    outcome      TEXT,
    report       BYTEA,
    log          BYTEA
);

-- The owner invariant, enforced by the database: at most one task per slot
-- is admitted, running or being stopped, whichever node decided it.
CREATE UNIQUE INDEX taskhost_one_owner ON taskhost_tasks (slot)
    WHERE state IN ('ready', 'running', 'stopping');
CREATE INDEX taskhost_ready ON taskhost_tasks (id) WHERE state = 'ready';
CREATE INDEX taskhost_queue ON taskhost_tasks (slot, pos) WHERE state = 'queued';
CREATE INDEX taskhost_claimed ON taskhost_tasks (node) WHERE state IN ('running', 'stopping');
CREATE INDEX taskhost_names ON taskhost_tasks (name, id);
CREATE INDEX taskhost_finished ON taskhost_tasks (finished_ms) WHERE state = 'finished';

-- Every attempt that started, with the node and token it ran under: the
-- record the owner invariant is checked against (no two attempts of one
-- slot overlap in time). `ended_ms` is NULL while it runs.
CREATE TABLE taskhost_attempts (
    task_id    BIGINT  NOT NULL,
    attempt    INTEGER NOT NULL,
    token      BIGINT  NOT NULL,
    slot       TEXT    NOT NULL,
    node       BIGINT  NOT NULL,
    started_ms BIGINT  NOT NULL,
    ended_ms   BIGINT,
    result     TEXT,
    PRIMARY KEY (task_id, attempt, token)
);

-- Plugins by digest, stored once for the whole cluster; each node keeps
-- its own copy and compiled code.
CREATE TABLE taskhost_plugins (
    digest    BYTEA  PRIMARY KEY,
    name      TEXT,
    bytes     BYTEA  NOT NULL,
    stored_ms BIGINT NOT NULL
);
