-- Where a task's pause before its next attempt ends (a retry's backoff or a
-- periodic interval), so recovery resumes it at the same deadline; NULL
-- while an attempt runs or before the first. `failures` is the streak of
-- failed attempts at that point (the retry budget's count).
ALTER TABLE tasks ADD COLUMN resume_at_ms INTEGER;
ALTER TABLE tasks ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
