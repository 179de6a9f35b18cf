// Package postbox holds the wire types every part of postbox agrees on: the
// Envelope an event travels in, the Reply (ACK or NACK) a receiver answers
// with, and the error codes a NACK carries.
//
// postbox moves events from where they happen to the code that handles them
// without losing one and without handling one twice. A producer keeps each
// event in a durable outbox until the receiver's ACK, and the receiver sends
// that ACK only after the transaction holding the event has committed. An
// event's identity is (source, event_id): a redelivery is acknowledged again
// and stored once; a redelivery with another payload is refused as a
// conflict.
//
// This package imports the standard library only: no other package of
// postbox (internal ones included) and no third-party module. Its JSON
// decoder and encoder are its own; besides the envelope, it exports of
// them only what the wire says of a payload: Valid (one JSON value),
// AppendCompact (the bytes a receiver stores) and CheckPayloadDepth (how
// deep it may nest).
package postbox

// SchemaVersion is the envelope schema this version of postbox writes and
// accepts.
const SchemaVersion = 1
