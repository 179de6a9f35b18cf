-- Endpoint flow control: a target's rate and concurrency limits and its
-- circuit breaker's settings (NULL: the defaults), and the state of each
-- breaker that is not closed.
ALTER TABLE subscriptions ADD COLUMN endpoint_rate TEXT;           -- "50/s": attempts started per period, in each process
ALTER TABLE subscriptions ADD COLUMN endpoint_concurrency INTEGER; -- attempts in flight at once, in each process
ALTER TABLE subscriptions ADD COLUMN breaker_failures INTEGER;     -- consecutive failures that open the breaker; -1: no breaker
ALTER TABLE subscriptions ADD COLUMN breaker_probe_ms BIGINT;     -- between probes of an open breaker
ALTER TABLE subscriptions ADD COLUMN disable_after_ms BIGINT;     -- open this long: disabled

-- One row per inbox whose endpoint's breaker is open or disabled; none:
-- closed. Written at transitions (and when a probe is taken), never per
-- attempt, and read by every process delivering to the inbox.
CREATE TABLE endpoint_breakers (
  inbox_id   TEXT PRIMARY KEY,
  state      TEXT NOT NULL CHECK (state IN ('open', 'disabled')),
  opened_at  TEXT NOT NULL,                -- when it opened: disabled after the endpoint's disable_after
  probe_at   TEXT NOT NULL,                -- when the next probe may go
  failures   INTEGER NOT NULL,             -- consecutive failed attempts when it opened, and failed probes since
  last_error TEXT,
  updated_at TEXT NOT NULL
);
