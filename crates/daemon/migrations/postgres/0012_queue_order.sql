-- A slot's queue in the order it is run (position, then id): its head and
-- its next in line are the index's first entries, its last position the
-- index's last, without reading or sorting the whole queue.
DROP INDEX IF EXISTS taskhost_queue;
CREATE INDEX taskhost_queue ON taskhost_tasks (slot, pos, id) WHERE state = 'queued';
