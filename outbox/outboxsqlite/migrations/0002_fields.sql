-- Rows keep the event's fields instead of its envelope: payload_json
-- becomes the event's payload alone, and the envelope's other fields get
-- columns of their own. A publisher to a postbox server builds the
-- envelope again from them; every other publisher sends the payload.
-- json_extract returns the payload object as the envelope held it (the
-- envelope was stored compact, so its text is the same bytes).
ALTER TABLE outbox ADD COLUMN occurred_at TEXT NOT NULL DEFAULT '';   -- the envelope's ts, as its producer gave it
ALTER TABLE outbox ADD COLUMN correlation_id TEXT NOT NULL DEFAULT ''; -- the envelope's session_id
ALTER TABLE outbox ADD COLUMN tenant_id TEXT NOT NULL DEFAULT '';      -- the envelope's device_id
ALTER TABLE outbox ADD COLUMN source_seq INTEGER;                      -- the envelope's seq, if it had one

UPDATE outbox SET
  occurred_at    = json_extract(payload_json, '$.ts'),
  correlation_id = json_extract(payload_json, '$.session_id'),
  tenant_id      = json_extract(payload_json, '$.device_id'),
  source_seq     = json_extract(payload_json, '$.seq'),
  payload_json   = json_extract(payload_json, '$.payload');
