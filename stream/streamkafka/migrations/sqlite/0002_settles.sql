-- Settles by round (see the package doc): an Append round that stored all
-- it produced writes one row here instead of updating each identity's.
-- An identity row whose claim_token has a row here is stored, at the
-- offset that row's offsets give its claim_pos (the position of its event
-- in its Append call); offsets holds, for each position from 0 up,
-- uvarint(offset - first_offset + 1), or 0 for a position not stored by
-- the round. Every record of a round has the round's stored_at.
ALTER TABLE kafka_identities ADD COLUMN claim_pos BIGINT;

CREATE TABLE kafka_settles (
    claim_token  TEXT PRIMARY KEY,
    stream_id    TEXT NOT NULL,
    first_offset BIGINT NOT NULL,
    last_offset  BIGINT NOT NULL,
    stored_at    BIGINT NOT NULL,
    offsets      BLOB NOT NULL
);

-- Trim: the settles below an offset, and the identity rows of a settle.
CREATE INDEX kafka_settles_first ON kafka_settles (stream_id, first_offset);
CREATE INDEX kafka_identities_token ON kafka_identities (claim_token);

-- Only identities settled in their own row have an event_offset to find
-- by: a claim no longer enters this index.
DROP INDEX kafka_identities_offset;
CREATE INDEX kafka_identities_offset ON kafka_identities (stream_id, event_offset) WHERE event_offset IS NOT NULL;
