-- The checkpoint of each feed follower: the last remote offset it stored,
-- written once the append holding that event committed.
CREATE TABLE feed_checkpoints (
  name        TEXT PRIMARY KEY,   -- the follower's name (its source)
  last_offset INTEGER NOT NULL,   -- the last remote offset stored
  updated_at  TEXT NOT NULL
);
