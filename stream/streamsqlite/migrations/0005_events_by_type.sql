-- A stream's events by type, for search (stream.Searcher): the index
-- ends with the key (pos), so the events of one type are read newest
-- first without a sort. A native id has its unique index already, and a
-- stored time is a range of keys (stored times never decrease along a
-- stream).
CREATE INDEX stream_events_by_type ON stream_events (stream_id, event_type);
