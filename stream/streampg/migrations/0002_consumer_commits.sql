-- Audit of commits and resets (as on SQLite): not needed for correctness,
-- kept for operators (when did this consumer pass that offset, who moved it
-- back?). The newest 1000 per consumer are kept.
CREATE TABLE consumer_commits (
  commit_id        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  consumer_id      TEXT NOT NULL,
  stream_id        TEXT NOT NULL,
  committed_offset BIGINT NOT NULL,          -- the consumer's next offset is this + 1
  kind             TEXT NOT NULL CHECK (kind IN ('commit', 'reset')),
  start_json       TEXT,                     -- a reset's start position
  committed_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX consumer_commits_consumer ON consumer_commits (consumer_id, commit_id);
