-- A reply is an answer to an item's event, sent to the url of the event's
-- delivery handle: one row per (inbox, item, reply key), so that asking
-- again with a key is answered by the reply it made. The workers lease a
-- due reply as they lease items (lease_token, lease_expires_at), and
-- settle it with its attempt, in one transaction.
CREATE TABLE replies (
  reply_id         INTEGER PRIMARY KEY,
  inbox_id         TEXT NOT NULL,
  item_id          INTEGER NOT NULL,
  reply_key        TEXT NOT NULL,
  source_id        TEXT NOT NULL,             -- the item's stream: its reply settings sign and authorise it
  handle_kind      TEXT NOT NULL,             -- the kind of the item's delivery handle
  url              TEXT NOT NULL,
  body             TEXT NOT NULL,             -- JSON
  state            TEXT NOT NULL,             -- pending, completed, failed (a dead letter)
  attempts         INTEGER NOT NULL DEFAULT 0,
  next_attempt_at  TEXT NOT NULL,
  lease_token      TEXT,
  lease_expires_at TEXT,
  last_error       TEXT,
  created_at       TEXT NOT NULL,
  updated_at       TEXT NOT NULL,
  UNIQUE (item_id, inbox_id, reply_key)      -- also deletes them with their item
);
CREATE INDEX replies_due ON replies (state, next_attempt_at);

-- The attempt log of replies, as delivery_attempts is the items'.
CREATE TABLE reply_attempts (
  attempt_id       INTEGER PRIMARY KEY,
  reply_id         INTEGER NOT NULL,
  attempt          INTEGER NOT NULL,
  attempted_at     TEXT NOT NULL,
  endpoint_url     TEXT NOT NULL,
  status_code      INTEGER NOT NULL,
  latency_us       INTEGER NOT NULL,
  error            TEXT,
  response_excerpt TEXT
);
CREATE INDEX reply_attempts_by_reply ON reply_attempts (reply_id, attempt_id);
