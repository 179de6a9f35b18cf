-- payload keeps the bytes its producer wrote: TEXT instead of JSONB, which
-- reordered keys, dropped duplicates and respaced the JSON. Rows written
-- before keep jsonb's text of them. The change rewrites the table under an
-- exclusive lock: on a large outbox, run it when writes can wait (or apply
-- Migrations yourself, in a maintenance window). Cast payload::jsonb to
-- query into it.
ALTER TABLE outbox ALTER COLUMN payload TYPE TEXT USING payload::text;
