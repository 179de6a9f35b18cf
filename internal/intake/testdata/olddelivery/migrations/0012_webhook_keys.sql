-- Random keys of the store, each made once and never shown (Delivery.Key):
-- the API shows a secret's fingerprint as an HMAC under one of them, which
-- tells one secret from another and nothing of either.
CREATE TABLE store_keys (
  name       TEXT PRIMARY KEY,
  key_hex    TEXT NOT NULL,
  created_at TEXT NOT NULL
);

-- The bodies of webhooks whose provider signs the body alone (GitHub):
-- within its replay window, a body delivered under one key is not stored
-- again under another (Delivery.ClaimDigest). Expired rows are deleted
-- by the claims that come after them.
CREATE TABLE webhook_digests (
  source_id  TEXT NOT NULL,
  digest     TEXT NOT NULL,                -- hex SHA-256 of the body as received
  native_id  TEXT NOT NULL,                -- the key it was first delivered under
  expires_at TEXT NOT NULL,
  PRIMARY KEY (source_id, digest)
);
CREATE INDEX webhook_digests_expires ON webhook_digests (expires_at);
