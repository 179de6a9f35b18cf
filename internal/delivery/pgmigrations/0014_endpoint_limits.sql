-- The limits of an endpoint across the processes sharing the store: its
-- rate as one token bucket, its concurrency as numbered slots. A SQLite
-- store has one process, which keeps both in memory.

-- One bucket per inbox whose endpoint has a rate: tokens left when it was
-- last refilled; a process takes a batch of them per statement.
CREATE TABLE endpoint_rates (
  inbox_id    TEXT PRIMARY KEY,
  tokens      DOUBLE PRECISION NOT NULL,
  refilled_at TIMESTAMPTZ NOT NULL
);

-- Slot 1 to the endpoint's concurrency: a process holds a slot for an
-- attempt in flight (and keeps it while it has more to send). A slot whose
-- holder's node lease (delivery_leases node:HOLDER) ended is free, so
-- that the slots of a process that died come back within the lease TTL.
CREATE TABLE endpoint_slots (
  inbox_id TEXT NOT NULL,
  slot     INTEGER NOT NULL,
  holder   TEXT NOT NULL,                -- node/<random>: one process
  taken_at TIMESTAMPTZ NOT NULL,
  PRIMARY KEY (inbox_id, slot)
);
