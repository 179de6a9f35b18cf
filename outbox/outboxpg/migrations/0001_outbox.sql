-- The transactional outbox, plus what a relay needs to retry and park
-- rows. event_id and correlation_id are TEXT, not UUID: postbox's own ids
-- ("evt_" + ULID), webhook idempotency keys and UUIDs all fit. seq orders
-- the rows; id is the row key.
CREATE TABLE IF NOT EXISTS outbox (
  id              UUID PRIMARY KEY DEFAULT gen_random_uuid(),
  seq             BIGINT GENERATED ALWAYS AS IDENTITY,
  event_type      TEXT NOT NULL,
  event_id        TEXT NOT NULL UNIQUE,
  payload         JSONB NOT NULL,
  correlation_id  TEXT NOT NULL,
  tenant_id       TEXT NOT NULL DEFAULT '',
  created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
  delivered_at    TIMESTAMPTZ,                         -- set when a relay got the receiver's ACK
  attempts        INTEGER NOT NULL DEFAULT 0,          -- sends that got no ACK
  next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),  -- also a relay's claim: in the future while it sends
  last_error      TEXT,
  rejected_at     TIMESTAMPTZ                          -- refused for good or parked; NULL again on requeue
) WITH (fillfactor = 70); -- room on each page, so a relay's claim (next_attempt_at) is a HOT update

-- What relays read: undelivered, unparked rows in order.
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (seq) WHERE delivered_at IS NULL AND rejected_at IS NULL;
-- What retention deletes.
CREATE INDEX IF NOT EXISTS outbox_delivered ON outbox (delivered_at) WHERE delivered_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_rejected ON outbox (seq) WHERE rejected_at IS NOT NULL;

-- One notification per inserting statement wakes the relays (LISTEN
-- postbox_outbox); they poll as well, so a lost one only costs latency.
CREATE OR REPLACE FUNCTION postbox_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('postbox_outbox', '');
  RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION postbox_outbox_notify();
