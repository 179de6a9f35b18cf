-- Replays of a time range (as on SQLite): jobs that return a subscription's completed
-- and failed items to pending, batch by batch, so that they are delivered
-- again.
--
-- A job walks the subscription's items in (created_at, item_id) order;
-- each batch moves its cursor (cursor_at, cursor_id) in the transaction
-- that replays the batch's items, so that a job resumed after a restart
-- replays no item twice.
CREATE TABLE replays (
  replay_id        TEXT PRIMARY KEY,          -- rpl_<ULID>
  subscription_id  TEXT NOT NULL,
  subscription_uid TEXT NOT NULL,             -- the items of this subscription, not of an older one of its name
  inbox_id         TEXT NOT NULL,
  since            TEXT NOT NULL,             -- items created at or after since
  until            TEXT NOT NULL,             -- and before until
  states           TEXT NOT NULL,             -- "completed,failed": the states it replays
  batch_size       INTEGER NOT NULL,
  state            TEXT NOT NULL CHECK (state IN ('running', 'completed', 'failed')),
  matched          BIGINT NOT NULL,           -- items of the range in those states when it started
  replayed         BIGINT NOT NULL DEFAULT 0,
  batches          INTEGER NOT NULL DEFAULT 0,
  cursor_at        TEXT NOT NULL,             -- the last item walked: its created_at and item_id
  cursor_id        BIGINT NOT NULL DEFAULT 0,
  error            TEXT,
  created_at       TEXT NOT NULL,
  updated_at       TEXT NOT NULL,
  finished_at      TEXT
);
CREATE INDEX replays_by_subscription ON replays (subscription_id, created_at);

-- A subscription's items by when they were made, for replays of a range.
CREATE INDEX inbox_items_by_created ON inbox_items (subscription_uid, created_at, item_id);
