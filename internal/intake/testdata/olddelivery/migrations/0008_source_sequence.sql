-- The source's own sequence number of an item's event (stream.Event's
-- Sequence), when the source sent one: NULL otherwise. occurred_at is the
-- source's time; "offset" is the order the stream stored the event in.
ALTER TABLE inbox_items ADD COLUMN source_sequence INTEGER;
