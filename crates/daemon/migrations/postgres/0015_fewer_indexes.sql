-- Every index a task's row is in costs an entry at each of its versions.
-- Claims read the ready tasks by namespace (taskhost_ready_ns), and count a
-- namespace's running tasks among the few that run (taskhost_claimed).
DROP INDEX IF EXISTS taskhost_ready;
DROP INDEX IF EXISTS taskhost_claimed_ns;
