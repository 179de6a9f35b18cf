-- An event of postbox's device stream is identified by (event_id,
-- device_id): the ingress stores the envelope's device_id as the event's
-- variant. Events stored before that have variant '' and their device in
-- metadata_json; give them the variant they would get now, so that a
-- redelivery of one is still a duplicate. The stream's id is its source's,
-- "devices" (postbox serve's DeviceSource).
--
-- Until now every event of this stream had variant '', so one event_id had
-- one row and (stream_id, source_native_id, device_id) is unique too; the
-- NOT EXISTS keeps the migration safe should a row with that variant be
-- there already.
UPDATE stream_events AS e
SET event_variant = json_extract(e.metadata_json, '$.device_id')
WHERE e.stream_id = 'devices'
  AND e.event_variant = ''
  AND json_valid(e.metadata_json)
  AND json_type(e.metadata_json, '$.device_id') = 'text'
  AND json_extract(e.metadata_json, '$.device_id') <> ''
  AND NOT EXISTS (SELECT 1 FROM stream_events o
    WHERE o.stream_id = e.stream_id AND o.source_native_id = e.source_native_id
      AND o.event_variant = json_extract(e.metadata_json, '$.device_id'));
