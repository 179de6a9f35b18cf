-- Sources: where events come from, each with its stream, its kind's
-- settings and a checkpoint of how far it has read upstream; and markers
-- of what the store did once (the default sources and subscription are
-- created once, and what an operator deletes stays deleted).
CREATE TABLE sources (
  source_id     TEXT PRIMARY KEY,             -- the name users give it
  kind          TEXT NOT NULL,                -- device, webhook, ...
  stream_id     TEXT NOT NULL,                -- its stream: one source, one stream
  settings_json TEXT NOT NULL,                -- the kind's settings, {} for none
  created_at    TEXT NOT NULL
);

-- How far a source that reads from upstream (a poller, a feed) has read:
-- written with the events it stored, loaded at start. Sources that are
-- sent to (devices, webhooks) have none.
CREATE TABLE source_checkpoints (
  source_id     TEXT PRIMARY KEY,
  next_cursor   TEXT,                         -- what to ask upstream for next
  last_event_at TEXT,                         -- the source's time of the last event stored
  last_error    TEXT,
  last_poll_at  TEXT,
  updated_at    TEXT NOT NULL
);

CREATE TABLE store_markers (
  marker     TEXT PRIMARY KEY,                -- e.g. default-sources
  created_at TEXT NOT NULL
);
