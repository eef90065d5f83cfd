-- Namespaces (`host ns add NAME ...`): each one's weight and quotas as
-- JSON, `{"weight":1,"quotas":[["Running",8]]}`. The default namespace is
-- here only once its operator changes it.
CREATE TABLE namespaces (
    name     TEXT PRIMARY KEY,
    settings TEXT NOT NULL
) WITHOUT ROWID;
