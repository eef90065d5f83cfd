-- Every accepted submission, from its acknowledgement to the end of its
-- retention. `request` is the submission as the daemon resolved it (name,
-- slot and policy filled in), postcard-encoded; `report` and `log` are the
-- final report and the guest's lines, postcard-encoded, once it finished.
CREATE TABLE tasks (
    id           INTEGER PRIMARY KEY,
    name         TEXT    NOT NULL,
    slot         TEXT    NOT NULL,
    plugin       TEXT    NOT NULL,          -- the plugin's name, for ps
    digest       BLOB    NOT NULL,          -- the plugin's sha256
    request      BLOB    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'stopping', 'finished')),
    attempts     INTEGER NOT NULL DEFAULT 0, -- attempts started
    submitted_ms INTEGER NOT NULL,
    finished_ms  INTEGER,
    report       BLOB,
    log          BLOB
);

-- Recovery reads the unfinished tasks in id order (their admission order).
CREATE INDEX tasks_unfinished ON tasks (id) WHERE state <> 'finished';
-- Retention and `ps --all` read the finished ones newest first.
CREATE INDEX tasks_finished ON tasks (finished_ms) WHERE state = 'finished';
CREATE INDEX tasks_name ON tasks (name, id);

-- Counters that outlive the rows: `next_id` never goes back, even when
-- retention deleted every row.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('next_id', 1);
