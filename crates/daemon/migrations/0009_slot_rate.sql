-- A slot rule's rate of starts (`host slot set PATTERN --rate 100/s
-- --burst 20`): STARTS per PER_MS milliseconds, and the starts it may
-- make beyond that pace; NULL: none.
ALTER TABLE slot_rules ADD COLUMN rate_starts INTEGER;
ALTER TABLE slot_rules ADD COLUMN rate_per_ms INTEGER;
ALTER TABLE slot_rules ADD COLUMN burst INTEGER;
