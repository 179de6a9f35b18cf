-- The W3C trace context each event travels with (traceparent and
-- tracestate), '' when it has none; a relay sends it on with the event.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS traceparent TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS tracestate  TEXT NOT NULL DEFAULT '';
