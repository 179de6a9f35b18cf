-- The items of each inbox and subscription by state, kept as they change
-- rather than counted (GET /v1/inboxes, the subscriptions list,
-- postbox_inbox_items): a ledger of signed amounts, one row written by
-- each transaction that inserts items (+pending), moves them between
-- states (-from, +to) or deletes them (retention), per inbox and
-- subscription uid. A count is the sum of its rows; rows are folded into
-- one per inbox and subscription now and then. Rows are only ever
-- inserted and deleted, never updated, so transactions that move items of
-- one inbox at once never wait for each other on a counter row. It
-- replaces inbox_tallies, which kept completed alone.
CREATE TABLE item_counts (
  count_id         INTEGER PRIMARY KEY,
  inbox_id         TEXT NOT NULL,
  subscription_uid TEXT NOT NULL,
  pending          INTEGER NOT NULL,
  processing       INTEGER NOT NULL,
  completed        INTEGER NOT NULL,
  failed           INTEGER NOT NULL
);
INSERT INTO item_counts (inbox_id, subscription_uid, pending, processing, completed, failed)
  SELECT inbox_id, subscription_uid, sum(state = 'pending'), sum(state = 'processing'),
    sum(state = 'completed'), sum(state = 'failed')
  FROM inbox_items GROUP BY inbox_id, subscription_uid;
DROP TABLE inbox_tallies;
