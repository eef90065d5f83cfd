-- Room on each page for a row's next version: an attempt's start (the
-- task's `attempts`) and its end (the attempt's `ended_ms` and `result`)
-- change no indexed column, so with free space on the page they are
-- heap-only updates, which write no index entries.
ALTER TABLE taskhost_tasks SET (fillfactor = 70);
ALTER TABLE taskhost_attempts SET (fillfactor = 70);
