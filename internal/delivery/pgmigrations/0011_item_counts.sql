-- The items of each inbox and subscription by state, kept as they change
-- rather than counted, as on SQLite: a ledger of signed amounts written
-- by the transactions that insert, move and delete items, folded now and
-- then. Rows are only ever inserted and deleted, never updated, so
-- processes leasing and acking items of one inbox at once do not wait
-- for each other on a counter row. It replaces inbox_tallies, which kept
-- completed alone.
CREATE TABLE item_counts (
  inbox_id         TEXT NOT NULL,
  subscription_uid TEXT NOT NULL,
  pending          BIGINT NOT NULL,
  processing       BIGINT NOT NULL,
  completed        BIGINT NOT NULL,
  failed           BIGINT NOT NULL
);
INSERT INTO item_counts (inbox_id, subscription_uid, pending, processing, completed, failed)
  SELECT inbox_id, subscription_uid, count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'processing'),
    count(*) FILTER (WHERE state = 'completed'), count(*) FILTER (WHERE state = 'failed')
  FROM inbox_items GROUP BY inbox_id, subscription_uid;
DROP TABLE inbox_tallies;
