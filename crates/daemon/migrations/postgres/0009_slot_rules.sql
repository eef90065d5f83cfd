-- The operator's slot rules (`host slot set`), the same for every node:
-- a rule's settings are JSON (`SlotSettings`). `version` counts changes:
-- a node that reads a newer one than it knows loads the rules again.
CREATE TABLE taskhost_slot_rules (
    pattern  TEXT PRIMARY KEY,
    settings TEXT NOT NULL
);
CREATE TABLE taskhost_slot_rules_version (
    one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    version BIGINT  NOT NULL DEFAULT 0
);
INSERT INTO taskhost_slot_rules_version DEFAULT VALUES;
-- Each slot's settings as its rules resolve them, kept on its row: the
-- node that creates the row writes them, a change of rules rewrites every
-- row (under a table lock that admissions wait for), so a decision or a
-- release reads them from the row it locks. NULL capacity: no rule sets
-- one, and the capacity its latest submission's plugin declared counts
-- (`declared`, WIT 0.1.2; NULL: 1). NULL max_queue: the node's
-- --max-slot-queue.
ALTER TABLE taskhost_slots ADD COLUMN capacity INTEGER;
ALTER TABLE taskhost_slots ADD COLUMN max_queue BIGINT;
ALTER TABLE taskhost_slots ADD COLUMN declared INTEGER;
-- When a task became its slot's owner, as a number that only grows (its
-- `pos` while it owns): Replace stops the oldest owner of a full slot.
CREATE SEQUENCE taskhost_owner_seq;
-- A slot may hold more than one owner now: the bound is its capacity,
-- kept by the slot row's lock that every decision in it takes (admission,
-- release, cancel, takeover, a change of rules), no longer by a unique
-- index. The index stays for the reads: owners by age.
DROP INDEX IF EXISTS taskhost_one_owner;
CREATE INDEX taskhost_owners ON taskhost_tasks (slot, pos)
    WHERE state IN ('ready', 'running', 'stopping');
-- Debounce (`host slot set --debounce DUR --max-wait DUR`): the settings
-- on the slot's row, and the one submission a debounced slot holds: a
-- delayed row whose `debounce_first_ms` is when its run of superseding
-- submissions began (NULL for every other row).
ALTER TABLE taskhost_slots ADD COLUMN debounce_ms BIGINT;
ALTER TABLE taskhost_slots ADD COLUMN max_wait_ms BIGINT;
ALTER TABLE taskhost_tasks ADD COLUMN debounce_first_ms BIGINT;
CREATE INDEX taskhost_debounced ON taskhost_tasks (slot)
    WHERE state = 'delayed' AND debounce_first_ms IS NOT NULL;
