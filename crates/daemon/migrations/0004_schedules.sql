-- Schedules (`host schedule add`): the schedule as it was added (`spec`,
-- a postcard-encoded ScheduleSpec), whether it is paused, its next firing
-- and its last one with the task that firing made. A firing is written in
-- the same transaction as its task's row, so after a crash a schedule has
-- fired exactly the tasks the store holds.
CREATE TABLE schedules (
    name         TEXT    PRIMARY KEY,
    spec         BLOB    NOT NULL,
    plugin       TEXT    NOT NULL,
    paused       INTEGER NOT NULL DEFAULT 0,
    next_ms      INTEGER,
    last_fire_ms INTEGER,
    last_task    INTEGER,
    created_ms   INTEGER NOT NULL
) WITHOUT ROWID;
