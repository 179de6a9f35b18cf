-- Markers (as on SQLite) of what the store did once (the default sources and
-- subscription are created once, and what an operator deletes stays
-- deleted).
--
-- This migration also created the tables sources and source_checkpoints
-- until they moved to intake's migrations (internal/intake), which
-- create them if they are not there: a database migrated before keeps
-- them and their rows.
CREATE TABLE store_markers (
  marker     TEXT PRIMARY KEY,                -- e.g. default-sources
  created_at TEXT NOT NULL
);
