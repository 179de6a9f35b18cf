-- The identity index of streamkafka (see the package doc). Times are unix
-- microseconds.
CREATE TABLE kafka_streams (
    stream_id  TEXT PRIMARY KEY,
    topic      TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

-- One row per identity: claimed (event_offset NULL, a claim token and its
-- expiry) from the claim until the settle, then stored (event_offset and
-- stored_at set, the claim columns NULL).
CREATE TABLE kafka_identities (
    stream_id      TEXT NOT NULL,
    native_id      TEXT NOT NULL,
    variant        TEXT NOT NULL,
    type           TEXT NOT NULL,
    payload_sha256 BYTEA NOT NULL,
    event_offset   BIGINT,
    stored_at      BIGINT,
    claimed_at     BIGINT,
    claim_until    BIGINT,
    claim_token    TEXT,
    PRIMARY KEY (stream_id, native_id, variant)
);

CREATE INDEX kafka_identities_offset ON kafka_identities (stream_id, event_offset);
