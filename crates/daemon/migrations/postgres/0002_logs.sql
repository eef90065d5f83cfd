-- The lines of tasks still running, shipped by the node that runs them so
-- that `host logs` on any node shows them (postcard-encoded `LogLine`s).
-- A task's rows go when its outcome is recorded: its log is then kept
-- with its report in `taskhost_tasks`.
CREATE TABLE taskhost_logs (
    seq     BIGSERIAL PRIMARY KEY,
    task_id BIGINT    NOT NULL,
    line    BYTEA     NOT NULL
);
CREATE INDEX taskhost_logs_task ON taskhost_logs (task_id, seq);
