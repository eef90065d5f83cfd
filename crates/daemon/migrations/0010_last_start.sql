-- When a task's latest attempt started (as the store wrote it): a restart
-- holds a rate-limited slot's starts until a period after its latest one.
ALTER TABLE tasks ADD COLUMN started_ms INTEGER;
