-- A child task's place in its tree (`taskhost:plugin/children`): the task
-- that spawned it and the root of that tree, so that every node's `ps`
-- shows the link and a tree's unfinished descendants are counted in the
-- transaction that admits one more. NULL for a task nobody spawned. Rows
-- stored before this migration get theirs from their request (the node
-- that migrates fills them in the same transaction).
ALTER TABLE taskhost_tasks ADD COLUMN parent BIGINT;
ALTER TABLE taskhost_tasks ADD COLUMN root BIGINT;
-- Only children's rows: the others cost no entry, and no upkeep as their
-- state moves on.
CREATE INDEX taskhost_tree ON taskhost_tasks (root)
    WHERE root IS NOT NULL AND state <> 'finished';
