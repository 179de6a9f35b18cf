-- A settle names its identities, for Trim: the native id and variant of
-- each event it stored, in position order, as uvarint lengths and bytes.
-- Trim deletes a settle's identity rows by them, so that no index of
-- identity rows by claim token is needed (Append would write it for every
-- event). Settles written before this have none; their identity rows stay
-- after a Trim as expired claims, which are resolved when met.
ALTER TABLE kafka_settles ADD COLUMN identities BLOB NOT NULL DEFAULT X'';
DROP INDEX kafka_identities_token;
