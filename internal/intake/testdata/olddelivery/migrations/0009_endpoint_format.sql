-- How an endpoint's requests carry the event: NULL the payload with
-- postbox's headers, 'cloudevents' a CloudEvent in binary mode.
ALTER TABLE subscriptions ADD COLUMN endpoint_format TEXT;
