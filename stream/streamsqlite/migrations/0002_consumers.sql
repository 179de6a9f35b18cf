-- Offsets per stream, consumers and their commits.
--
-- Each stream gets a number, and its events a range of the table's integer
-- key: pos = stream_no << 40 | offset. A stream's offsets are 1, 2, 3, ...
-- with no gap (the writer assigns them), a stream read from an offset is a
-- range scan of the key, and a consumer's lag is last_offset - next_offset
-- + 1, with no count and no extra index on the write path.
ALTER TABLE streams ADD COLUMN stream_no INTEGER;
ALTER TABLE streams ADD COLUMN last_offset INTEGER NOT NULL DEFAULT 0; -- the high watermark; never goes down
UPDATE streams SET stream_no = rowid;
CREATE UNIQUE INDEX streams_stream_no ON streams (stream_no);

CREATE TABLE stream_events_v2 (
  pos                  INTEGER PRIMARY KEY,    -- stream_no << 40 | offset
  "offset"             INTEGER GENERATED ALWAYS AS (pos & 1099511627775) VIRTUAL,
  stream_event_id      TEXT GENERATED ALWAYS AS (stream_id || '/' || (pos & 1099511627775)) VIRTUAL,
  stream_id            TEXT NOT NULL,
  source_id            TEXT NOT NULL,
  source_native_id     TEXT NOT NULL,
  event_variant        TEXT NOT NULL DEFAULT '',
  event_type           TEXT NOT NULL,
  occurred_at          TEXT NOT NULL,          -- source time (envelope ts), UTC
  metadata_json        TEXT NOT NULL,
  raw_payload_json     TEXT NOT NULL,
  delivery_handle_json TEXT,
  payload_sha256       BLOB NOT NULL,          -- sha256 of raw_payload_json (32 bytes)
  source_sequence      INTEGER,                -- the source's own sequence, if given
  created_at           TEXT NOT NULL,          -- first stored; never decreases along a stream
  last_seen_at         TEXT NOT NULL,          -- last delivery of this identity
  attempt_count        INTEGER NOT NULL DEFAULT 1, -- deliveries of this identity
  UNIQUE (stream_id, source_native_id, event_variant)
);

INSERT INTO stream_events_v2 (pos, stream_id, source_id, source_native_id, event_variant, event_type,
  occurred_at, metadata_json, raw_payload_json, delivery_handle_json, payload_sha256, source_sequence,
  created_at, last_seen_at, attempt_count)
SELECT (s.stream_no << 40) | row_number() OVER (PARTITION BY e.stream_id ORDER BY e."offset"),
  e.stream_id, e.source_id, e.source_native_id, e.event_variant, e.event_type, e.occurred_at,
  e.metadata_json, e.raw_payload_json, e.delivery_handle_json, e.payload_sha256, e.source_sequence,
  e.created_at, e.last_seen_at, e.attempt_count
FROM stream_events e JOIN streams s ON s.stream_id = e.stream_id;

DROP TABLE stream_events;
ALTER TABLE stream_events_v2 RENAME TO stream_events;
UPDATE streams SET last_offset = coalesce((SELECT max("offset") FROM stream_events e WHERE e.stream_id = streams.stream_id), 0);

-- One consumer per subscription: its own offset in one stream.
CREATE TABLE consumers (
  consumer_id     TEXT PRIMARY KEY,
  stream_id       TEXT NOT NULL REFERENCES streams (stream_id),
  subscription_id TEXT NOT NULL UNIQUE,
  consumer_key    TEXT NOT NULL UNIQUE,       -- stream_id/consumer_id
  start_policy    TEXT NOT NULL CHECK (start_policy IN ('latest', 'earliest', 'at_offset', 'at_time')),
  start_offset    INTEGER,
  start_time      TEXT,
  next_offset     INTEGER NOT NULL CHECK (next_offset >= 1),
  created_at      TEXT NOT NULL,
  updated_at      TEXT NOT NULL
);
CREATE INDEX idx_consumers_stream ON consumers (stream_id);

-- Audit of commits and resets: not needed for correctness, kept for
-- operators (when did this consumer pass that offset?).
CREATE TABLE consumer_commits (
  commit_id        TEXT PRIMARY KEY,
  consumer_id      TEXT NOT NULL,
  stream_id        TEXT NOT NULL,
  committed_offset INTEGER NOT NULL,          -- the consumer's next offset is this + 1
  committed_at     TEXT NOT NULL
);
CREATE INDEX idx_consumer_commits_consumer ON consumer_commits (consumer_id, committed_offset);
