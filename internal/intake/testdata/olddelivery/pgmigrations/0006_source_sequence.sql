-- The source's own sequence number of an item's event (as on SQLite), when
-- the source sent one: NULL otherwise.
ALTER TABLE inbox_items ADD COLUMN source_sequence BIGINT;
