-- Endpoints: a target's signing secrets and settings, and the log of every
-- attempt to deliver an item to a target.
--
-- NULL settings take the server's (delivery.Config) at each attempt.
ALTER TABLE subscriptions ADD COLUMN signing_secrets_json TEXT;  -- [{"secret":"whsec_…","created_at":T,"expires_at":T|null}], newest first
ALTER TABLE subscriptions ADD COLUMN endpoint_headers_json TEXT; -- {"X-Team":"billing"}: sent with every request
ALTER TABLE subscriptions ADD COLUMN endpoint_timeout_ms INTEGER;
ALTER TABLE subscriptions ADD COLUMN retry_schedule TEXT;        -- "5s,5m,30m": the wait after the n-th failed attempt; the last repeats
ALTER TABLE subscriptions ADD COLUMN retry_base_delay_ms INTEGER;
ALTER TABLE subscriptions ADD COLUMN retry_max_delay_ms INTEGER;
ALTER TABLE subscriptions ADD COLUMN max_attempts INTEGER;

-- One row per attempt of a worker to POST an item to its target, written
-- in the transaction that settles the item. Retention deletes them with
-- their item.
CREATE TABLE delivery_attempts (
  attempt_id       INTEGER PRIMARY KEY,
  item_id          INTEGER NOT NULL,
  inbox_id         TEXT NOT NULL,
  attempt          INTEGER NOT NULL,          -- the item's attempt number, from 1
  attempted_at     TEXT NOT NULL,
  endpoint_url     TEXT NOT NULL,
  status_code      INTEGER NOT NULL,          -- 0: no answer (a transport error or timeout)
  latency_us       INTEGER NOT NULL,
  error            TEXT,
  response_excerpt TEXT                       -- the first bytes of the answer's body
);
CREATE INDEX delivery_attempts_by_item ON delivery_attempts (item_id, attempt_id);
