-- Workers, dead letters and retention.
ALTER TABLE subscriptions ADD COLUMN target_url TEXT; -- workers POST its items here; NULL: a runtime leases them

ALTER TABLE inbox_items ADD COLUMN failed_at   TEXT;  -- when it became a dead letter
ALTER TABLE inbox_items ADD COLUMN replayed_at TEXT;  -- when an operator last replayed it
ALTER TABLE inbox_items ADD COLUMN replays     INTEGER NOT NULL DEFAULT 0;

-- Dead letters by when they failed (dlq list and replay by time range).
CREATE INDEX inbox_items_dead ON inbox_items (failed_at, item_id) WHERE state = 'failed';
-- Finished items by age, for retention.
CREATE INDEX inbox_items_finished ON inbox_items (updated_at) WHERE state IN ('completed', 'failed');
