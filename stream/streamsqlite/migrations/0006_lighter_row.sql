-- A lighter row: what every event stored the same as another column is
-- derived instead of written, and the identity's index compares first
-- what tells identities apart.
--
-- source_id is the stream's id (a stream is named after its source), and
-- last_seen_at is created_at until a redelivery sets redelivered_at: both
-- become virtual columns, read as before, neither stored nor bound by an
-- append. The index by type leaves out stream_id: a stream's events are
-- a range of keys (pos), which ends every index entry, so a search by type
-- reads the range of one type's entries that lies in its stream's keys.
CREATE TABLE stream_events_v3 (
  pos                  INTEGER PRIMARY KEY,    -- stream_no << 40 | offset
  "offset"             INTEGER GENERATED ALWAYS AS (pos & 1099511627775) VIRTUAL,
  stream_event_id      TEXT GENERATED ALWAYS AS (stream_id || '/' || (pos & 1099511627775)) VIRTUAL,
  stream_id            TEXT NOT NULL,
  source_id            TEXT GENERATED ALWAYS AS (stream_id) VIRTUAL,
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
  redelivered_at       TEXT,                   -- the last redelivery of this identity; NULL: none
  last_seen_at         TEXT GENERATED ALWAYS AS (coalesce(redelivered_at, created_at)) VIRTUAL,
  attempt_count        INTEGER NOT NULL DEFAULT 1, -- deliveries of this identity
  -- The identity, native id first: two identities mostly differ in it, so
  -- a comparison in the index stops there instead of comparing the
  -- stream's id (the same for every event of it) first.
  UNIQUE (source_native_id, event_variant, stream_id)
);

INSERT INTO stream_events_v3 (pos, stream_id, source_native_id, event_variant, event_type, occurred_at,
  metadata_json, raw_payload_json, delivery_handle_json, payload_sha256, source_sequence, created_at,
  redelivered_at, attempt_count)
SELECT pos, stream_id, source_native_id, event_variant, event_type, occurred_at,
  metadata_json, raw_payload_json, delivery_handle_json, payload_sha256, source_sequence, created_at,
  CASE WHEN last_seen_at <> created_at THEN last_seen_at END, attempt_count
FROM stream_events ORDER BY pos;

DROP TABLE stream_events;
ALTER TABLE stream_events_v3 RENAME TO stream_events;
CREATE INDEX stream_events_by_type ON stream_events (event_type);
