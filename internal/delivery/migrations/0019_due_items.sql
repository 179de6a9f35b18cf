-- The pending items of an inbox by when they are due, so that a lease
-- reads the items due now and none of those due later: an inbox holding a
-- million items scheduled for tomorrow (an event's deliver_at) is leased
-- as fast as an empty one. By (inbox_items_by_state), which orders them by
-- id, a lease read every pending item until it found enough due ones.
CREATE INDEX inbox_items_due ON inbox_items (inbox_id, next_attempt_at, item_id) WHERE state = 'pending';
