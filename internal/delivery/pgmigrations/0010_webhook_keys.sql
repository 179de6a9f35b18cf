-- As on SQLite.
-- Random keys of the store, each made once and never shown (Delivery.Key):
-- the API shows a secret's fingerprint as an HMAC under one of them, which
-- tells one secret from another and nothing of either.
CREATE TABLE store_keys (
  name       TEXT PRIMARY KEY,
  key_hex    TEXT NOT NULL,
  created_at TEXT NOT NULL
);

-- This migration also created the table webhook_digests (and its index
-- webhook_digests_expires) until it moved to intake's migrations
-- (internal/intake), which create it if it is not there.
