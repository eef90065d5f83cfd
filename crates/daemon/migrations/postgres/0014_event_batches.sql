-- A node ships its events as one row per batch: `n` events, a postcard-
-- encoded list of `Event`s. Rows shipped before hold one event each
-- (`n` = 0). An event's seq is its row's seq times 1024 plus its place in
-- the row, so that readers keep one cursor across both.
ALTER TABLE taskhost_events ADD COLUMN n INTEGER NOT NULL DEFAULT 0;
-- Stored as they are: a batch is read once by each feed, compressing it
-- cost more than the bytes it saved.
ALTER TABLE taskhost_events ALTER COLUMN event SET STORAGE EXTERNAL;
