-- How many events an operator run (rebuild, verify, replay) has to go through, counted when it starts, so
-- that the CLI and the console can show a total, a rate and the time left. NULL: not counted (catch-up
-- runs, and runs recorded before this column existed).
ALTER TABLE ledgerflow.projection_runs ADD COLUMN events_total bigint;
