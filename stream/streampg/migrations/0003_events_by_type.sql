-- A stream's events by type, for search (stream.Searcher), newest first
-- without a sort. A native id has its unique index already, and a stored
-- time its index stream_events_stored_at.
CREATE INDEX stream_events_by_type ON stream_events (stream_id, event_type, event_offset);
