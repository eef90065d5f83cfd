-- The flight recorder's records of a finished task's attempts (a record
-- file, `host record export`), kept with its report and log and deleted
-- with them.
ALTER TABLE tasks ADD COLUMN records BLOB;
