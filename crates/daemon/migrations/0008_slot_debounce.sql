-- A slot rule's debounce (`host slot set PATTERN --debounce DUR
-- --max-wait DUR`), in milliseconds; NULL: none.
ALTER TABLE slot_rules ADD COLUMN debounce_ms INTEGER;
ALTER TABLE slot_rules ADD COLUMN max_wait_ms INTEGER;
