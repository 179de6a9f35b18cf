-- The token buckets of intake's rate limits shared by every node
-- (internal/intakerate): a source's webhooks (source:NAME) and a device
-- token's events (device:ID). A row is made full at its key's first take,
-- and refilled by the store's clock as it is taken from. One process on
-- SQLite keeps its buckets in memory: this table is PostgreSQL's alone.
CREATE TABLE IF NOT EXISTS intake_rates (
  limit_key   TEXT PRIMARY KEY,
  tokens      DOUBLE PRECISION NOT NULL,
  refilled_at TIMESTAMPTZ NOT NULL
);
