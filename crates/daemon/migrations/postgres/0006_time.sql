-- Time: delayed submissions, priorities and schedules.
--
-- A delayed submission (`host submit --delay|--at`) is a task row in the
-- state `delayed` until `due_ms`; then one node admits it (as any
-- submission, by its policy against its slot as it is then) in the
-- transaction that changes its state, so it enters its slot once.
ALTER TABLE taskhost_tasks DROP CONSTRAINT IF EXISTS taskhost_tasks_state_check;
ALTER TABLE taskhost_tasks ADD CONSTRAINT taskhost_tasks_state_check
    CHECK (state IN ('queued', 'ready', 'running', 'stopping', 'finished', 'delayed'));
ALTER TABLE taskhost_tasks ADD COLUMN due_ms BIGINT;
CREATE INDEX taskhost_delayed ON taskhost_tasks (due_ms, id) WHERE state = 'delayed';
-- Nodes claim ready work by priority, then in order.
ALTER TABLE taskhost_tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
DROP INDEX IF EXISTS taskhost_ready;
CREATE INDEX taskhost_ready ON taskhost_tasks (priority DESC, id) WHERE state = 'ready';
-- The schedule that fired a task.
ALTER TABLE taskhost_tasks ADD COLUMN schedule TEXT;

-- Schedules (`host schedule add`): `spec` is the postcard-encoded
-- ScheduleSpec (its request's slot and policy resolved when it was added).
-- A firing is one transaction that locks the row, moves `next_ms` on and
-- admits the task, so each due time fires once across every node.
CREATE TABLE taskhost_schedules (
    name         TEXT    PRIMARY KEY,
    spec         BYTEA   NOT NULL,
    plugin       TEXT    NOT NULL,
    digest       BYTEA   NOT NULL,
    paused       BOOLEAN NOT NULL DEFAULT FALSE,
    next_ms      BIGINT,
    last_fire_ms BIGINT,
    last_task    BIGINT,
    created_ms   BIGINT  NOT NULL
);
CREATE INDEX taskhost_schedules_due ON taskhost_schedules (next_ms) WHERE NOT paused;
