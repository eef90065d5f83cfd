-- A child task's place in its tree (`taskhost:plugin/children`): the task
-- that spawned it and the root of that tree, so that `ps --all` shows the
-- link after a restart and a tree's descendants can be counted. NULL for a
-- task nobody spawned. Rows stored before this migration get theirs from
-- their request at start (the store's open).
ALTER TABLE tasks ADD COLUMN parent INTEGER;
ALTER TABLE tasks ADD COLUMN root INTEGER;
