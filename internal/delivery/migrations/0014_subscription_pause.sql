-- A subscription's delivery paused by an operator (POST
-- /v1/subscriptions/{name}/pause): while paused_at is set, no item of the
-- subscription is leased, by the push workers or by a runtime; its loop
-- keeps filling its inbox. NULL: delivering.
ALTER TABLE subscriptions ADD COLUMN paused_at TEXT;
ALTER TABLE subscriptions ADD COLUMN paused_reason TEXT; -- what the operator said, if anything
