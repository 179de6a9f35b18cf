-- The edge outbox, plus a state for rows the receiver refused. seq orders
-- the rows (an explicit sequence, not event_id, keeps send order stable
-- across VACUUM).
CREATE TABLE outbox (
  seq             INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id        TEXT NOT NULL UNIQUE,
  event_type      TEXT NOT NULL,
  payload_json    TEXT NOT NULL,          -- the whole envelope, as it is sent
  created_at      TEXT NOT NULL,
  next_attempt_at TEXT NOT NULL,
  attempt_count   INTEGER NOT NULL DEFAULT 0, -- sends that got no ACK
  last_error      TEXT,
  state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'rejected')),
  rejected_at     TEXT
);

CREATE INDEX idx_outbox_state ON outbox (state, seq);
