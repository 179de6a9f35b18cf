-- Each subscription's read position: the next stream offset its loop
-- materialises. It is written in the transaction that writes a batch's
-- items, so items and position move together on any stream backend; the
-- stream backend's consumer follows it afterwards. A subscription without
-- a row (one that ran before this table existed) starts at its stream
-- consumer's offset, recorded here at once.
CREATE TABLE positions (
  subscription_uid TEXT PRIMARY KEY,          -- a reused name gets a new uid, and a new position
  subscription_id  TEXT NOT NULL,
  stream_id        TEXT NOT NULL,
  next_offset      INTEGER NOT NULL,
  updated_at       TEXT NOT NULL
);
