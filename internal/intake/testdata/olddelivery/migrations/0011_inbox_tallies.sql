-- The completed items of each inbox, counted as they change rather than
-- by scanning them (GET /v1/inboxes, postbox_inbox_items): a ledger of
-- signed amounts, one row written by each transaction that completes
-- items (+n), deletes completed items (retention, -n) or replays them
-- (-n). An inbox's count is the sum of its rows; rows are folded into one
-- per inbox now and then. Pending, processing and failed items are
-- counted from the (inbox_id, state, item_id) index, which holds few of
-- them; no row is written when an item is inserted.
CREATE TABLE inbox_tallies (
  tally_id  INTEGER PRIMARY KEY,
  inbox_id  TEXT NOT NULL,
  completed INTEGER NOT NULL
);
INSERT INTO inbox_tallies (inbox_id, completed)
  SELECT inbox_id, count(*) FROM inbox_items WHERE state = 'completed' GROUP BY inbox_id;
