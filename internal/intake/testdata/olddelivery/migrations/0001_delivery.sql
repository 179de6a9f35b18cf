-- Subscriptions, inbox items and activations: delivery's own store, so
-- that a batch's items are written in one transaction.
CREATE TABLE subscriptions (
  subscription_id     TEXT PRIMARY KEY,       -- the name users give it; also its consumer's id
  subscription_uid    TEXT NOT NULL UNIQUE,   -- sub_<ULID>: a new one when a name is reused
  source_id           TEXT NOT NULL,
  stream_id           TEXT NOT NULL,
  inbox_id            TEXT NOT NULL,
  match_types_json    TEXT NOT NULL,          -- ["proposal.*", ...]; [] matches every type
  match_metadata_json TEXT NOT NULL,          -- {"device_id": "pi-7"}; {} matches every event
  start_policy        TEXT NOT NULL,
  start_offset        INTEGER,
  start_time          TEXT,
  created_at          TEXT NOT NULL
);

CREATE TABLE inbox_items (
  item_id              INTEGER PRIMARY KEY,
  inbox_id             TEXT NOT NULL,
  subscription_id      TEXT NOT NULL,
  subscription_uid     TEXT NOT NULL,
  stream_id            TEXT NOT NULL,
  "offset"             INTEGER NOT NULL,
  source_native_id     TEXT NOT NULL,
  event_type           TEXT NOT NULL,
  occurred_at          TEXT NOT NULL,
  stored_at            TEXT NOT NULL,
  metadata_json        TEXT NOT NULL,
  payload_json         TEXT NOT NULL,
  delivery_handle_json TEXT,                  -- copied from the stream event
  state                TEXT NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'processing', 'completed', 'failed')),
  attempts             INTEGER NOT NULL DEFAULT 0,
  next_attempt_at      TEXT NOT NULL,
  lease_token          TEXT,
  lease_expires_at     TEXT,
  last_error           TEXT,
  created_at           TEXT NOT NULL,
  updated_at           TEXT NOT NULL,
  completed_at         TEXT,
  UNIQUE (subscription_uid, "offset")         -- one item per subscription and stream event
);
CREATE INDEX inbox_items_by_state ON inbox_items (inbox_id, state, item_id);
CREATE INDEX inbox_items_leases ON inbox_items (lease_expires_at) WHERE state = 'processing';

-- One activation per materialised batch and inbox: the runtime behind the
-- inbox has new items (first_item_id..). The newest 1000 per subscription
-- are kept.
CREATE TABLE activations (
  activation_id   INTEGER PRIMARY KEY,
  subscription_id TEXT NOT NULL,
  inbox_id        TEXT NOT NULL,
  first_offset    INTEGER NOT NULL,
  last_offset     INTEGER NOT NULL,
  items           INTEGER NOT NULL,
  first_item_id   INTEGER NOT NULL,
  created_at      TEXT NOT NULL
);
CREATE INDEX activations_by_subscription ON activations (subscription_id, activation_id);
