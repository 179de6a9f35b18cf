-- Streams, their events and their consumers. Every statement runs with the
-- backend's schema first in search_path.

-- One row per stream. last_offset is the high watermark: it never goes
-- down, not even when retention deletes the newest events, so offsets are
-- never reused. An append locks this row (FOR UPDATE) for its transaction:
-- appenders of one stream, in any process, take turns; appenders of other
-- streams do not wait. last_stored_at is the stored time of the newest
-- append, a floor that keeps stored times from going back along a stream.
CREATE TABLE streams (
  stream_id      TEXT PRIMARY KEY,
  source_id      TEXT NOT NULL UNIQUE,
  backend        TEXT NOT NULL,
  created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  last_offset    BIGINT NOT NULL DEFAULT 0 CHECK (last_offset >= 0),
  last_stored_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
);

-- Events. Payload, metadata and delivery handle are kept as the bytes the
-- source sent (bytea, not jsonb, which would rewrite them): duplicates are
-- told from conflicts by comparing payload bytes.
CREATE TABLE stream_events (
  stream_id       TEXT NOT NULL REFERENCES streams (stream_id),
  event_offset    BIGINT NOT NULL CHECK (event_offset >= 1),
  native_id       TEXT NOT NULL,
  variant         TEXT NOT NULL DEFAULT '',
  event_type      TEXT NOT NULL,
  occurred_at     TIMESTAMPTZ NOT NULL,  -- the source's time
  source_sequence BIGINT,                -- the source's own sequence, if given
  metadata        BYTEA NOT NULL,
  payload         BYTEA NOT NULL,
  delivery_handle BYTEA,
  stored_at       TIMESTAMPTZ NOT NULL,  -- first stored; never decreases along a stream
  PRIMARY KEY (stream_id, event_offset),
  UNIQUE (stream_id, native_id, variant)
);

-- Start policy at_time and retention find the first event stored at or
-- after a time.
CREATE INDEX stream_events_stored_at ON stream_events (stream_id, stored_at);

-- One consumer per subscription: its own offset in one stream.
CREATE TABLE consumers (
  consumer_id  TEXT PRIMARY KEY,
  stream_id    TEXT NOT NULL REFERENCES streams (stream_id),
  consumer_key TEXT NOT NULL UNIQUE,     -- stream_id/consumer_id
  start_policy TEXT NOT NULL CHECK (start_policy IN ('latest', 'earliest', 'at_offset', 'at_time')),
  start_offset BIGINT,
  start_time   TIMESTAMPTZ,
  next_offset  BIGINT NOT NULL CHECK (next_offset >= 1),
  created_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  updated_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX consumers_stream ON consumers (stream_id);
