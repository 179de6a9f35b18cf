-- Sources: where events come from, each with its stream, its kind's
-- settings and a checkpoint of how far it has read upstream; and the
-- bodies of webhooks claimed against replays.
--
-- These tables were created by delivery's migrations 0005 and 0012 until
-- they moved here: IF NOT EXISTS keeps the rows of a database delivery
-- migrated then.
CREATE TABLE IF NOT EXISTS sources (
  source_id     TEXT PRIMARY KEY,             -- the name users give it
  kind          TEXT NOT NULL,                -- device, webhook, poll, feed
  stream_id     TEXT NOT NULL,                -- its stream: one source, one stream
  settings_json TEXT NOT NULL,                -- the kind's settings, {} for none
  created_at    TEXT NOT NULL
);

-- How far a source that reads from upstream (a poller, a feed) has read:
-- written with the events it stored, loaded at start. Sources that are
-- sent to (devices, webhooks) have none.
CREATE TABLE IF NOT EXISTS source_checkpoints (
  source_id     TEXT PRIMARY KEY,
  next_cursor   TEXT,                         -- what to ask upstream for next
  last_event_at TEXT,                         -- the source's time of the last event stored
  last_error    TEXT,
  last_poll_at  TEXT,
  updated_at    TEXT NOT NULL
);

-- The bodies of webhooks whose provider signs the body alone (GitHub):
-- within its replay window, a body delivered under one key is not stored
-- again under another (Store.ClaimDigest). Expired rows are deleted by
-- the claims that come after them.
CREATE TABLE IF NOT EXISTS webhook_digests (
  source_id  TEXT NOT NULL,
  digest     TEXT NOT NULL,                -- hex SHA-256 of the body as received
  native_id  TEXT NOT NULL,                -- the key it was first delivered under
  expires_at TEXT NOT NULL,
  PRIMARY KEY (source_id, digest)
);
CREATE INDEX IF NOT EXISTS webhook_digests_expires ON webhook_digests (expires_at);
