-- lease names the claim a relay holds a row under: the end its claim (Due)
-- first gave it. next_attempt_at is the claim's current end, which the
-- relay's heartbeat moves on while it is still sending or settling the
-- row; an outcome applies only under the lease it was sent under. NULL
-- when no relay holds the row. Not indexed, so that claims and heartbeats
-- stay HOT updates.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease TIMESTAMPTZ;
