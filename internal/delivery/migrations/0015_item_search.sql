-- Indexes of an event's deliveries and of the search of an inbox's items
-- (docs/API.md, Search). Items are written once and these columns never
-- change afterwards, so a state change touches none of them.
--
-- An event's items in every subscription: GET /v1/streams/{stream}/events/{offset}.
CREATE INDEX inbox_items_by_event ON inbox_items (stream_id, "offset");
-- An inbox's items by the event's id (an idempotency key, an event_id),
-- newest first.
CREATE INDEX inbox_items_by_native_id ON inbox_items (inbox_id, source_native_id, created_at, item_id);
-- An inbox's items by type and by time, newest first.
CREATE INDEX inbox_items_by_type ON inbox_items (inbox_id, event_type, created_at, item_id);
CREATE INDEX inbox_items_by_time ON inbox_items (inbox_id, created_at, item_id);
