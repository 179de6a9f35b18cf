-- The completed items of each inbox, counted as they change rather than
-- by scanning them, as on SQLite: a ledger of signed amounts written by
-- the transactions that complete (+n), delete (-n) or replay (-n)
-- completed items, folded now and then. Rows are only ever inserted and
-- deleted, never updated, so processes acking items of one inbox at once
-- do not wait for each other on a counter row.
CREATE TABLE inbox_tallies (
  inbox_id  TEXT NOT NULL,
  completed BIGINT NOT NULL
);
INSERT INTO inbox_tallies (inbox_id, completed)
  SELECT inbox_id, count(*) FROM inbox_items WHERE state = 'completed' GROUP BY inbox_id;
