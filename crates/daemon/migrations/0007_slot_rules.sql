-- The operator's slot rules (`host slot set PATTERN ...`): a slot named
-- exactly or by a glob pattern, and what it may hold. A column left NULL
-- keeps the default (one owner, the daemon's --max-slot-queue).
CREATE TABLE slot_rules (
    pattern   TEXT PRIMARY KEY,
    capacity  INTEGER,
    max_queue INTEGER
) WITHOUT ROWID;
