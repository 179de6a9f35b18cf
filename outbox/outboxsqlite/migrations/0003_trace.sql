-- The W3C trace context each event travels with (the envelope's
-- traceparent and tracestate), '' when it has none.
ALTER TABLE outbox ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox ADD COLUMN tracestate TEXT NOT NULL DEFAULT '';
