package streamkafka

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox/stream"
)

// Record headers: what a record holds of its event besides the native id
// (the key) and the payload (the value). A field that is empty has no
// header.
const (
	// HeaderVariant is the event's Variant.
	HeaderVariant = "postbox-variant"
	// HeaderType is the event's Type.
	HeaderType = "postbox-type"
	// HeaderOccurredAt is the event's OccurredAt, RFC 3339 in UTC with
	// nanoseconds.
	HeaderOccurredAt = "postbox-occurred-at"
	// HeaderSequence is the event's Sequence, in decimal.
	HeaderSequence = "postbox-sequence"
	// HeaderMetadata is the event's Metadata, JSON as given.
	HeaderMetadata = "postbox-metadata"
	// HeaderDeliveryHandle is the event's DeliveryHandle, JSON as given.
	HeaderDeliveryHandle = "postbox-delivery-handle"
)

// record returns the record of ev, for topic, stamped at.
func record(topic string, ev *stream.Event, at time.Time) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, 6)
	add := func(k string, v []byte) {
		if len(v) > 0 {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: v})
		}
	}
	add(HeaderVariant, []byte(ev.Variant))
	add(HeaderType, []byte(ev.Type))
	if !ev.OccurredAt.IsZero() {
		add(HeaderOccurredAt, ev.OccurredAt.UTC().AppendFormat(nil, time.RFC3339Nano))
	}
	if ev.Sequence != nil {
		add(HeaderSequence, strconv.AppendInt(nil, *ev.Sequence, 10))
	}
	add(HeaderMetadata, ev.Metadata)
	add(HeaderDeliveryHandle, ev.DeliveryHandle)
	var value []byte
	if len(ev.Payload) > 0 {
		value = ev.Payload
	}
	return &kgo.Record{Topic: topic, Key: []byte(ev.NativeID), Value: value, Headers: hs, Timestamp: at}
}

// recordSize is at least the bytes r takes in a record batch of its own:
// the batch header, and the record with every varint at its longest.
func recordSize(r *kgo.Record) int {
	const batchHeader, varint, longVarint = 61, 5, 10
	n := batchHeader + varint + 1 + longVarint + varint + varint + len(r.Key) + varint + len(r.Value) + varint
	for _, h := range r.Headers {
		n += varint + len(h.Key) + varint + len(h.Value)
	}
	return n
}

// header returns the value of header k of r, nil when it has none.
func header(r *kgo.Record, k string) []byte {
	for _, h := range r.Headers {
		if h.Key == k {
			return h.Value
		}
	}
	return nil
}

// holds reports whether r is the record of identity id.
func holds(r *kgo.Record, id identity) bool {
	return string(r.Key) == id.nativeID && string(header(r, HeaderVariant)) == id.variant
}

// decode returns the event r holds, at its offset in st.
func decode(st *streamRow, r *kgo.Record) (stream.StoredEvent, error) {
	e := stream.StoredEvent{
		Offset:   r.Offset + 1,
		StreamID: st.id,
		SourceID: st.id,
		StoredAt: r.Timestamp.UTC(),
	}
	e.ID = st.id + "/" + strconv.FormatInt(e.Offset, 10)
	e.NativeID = string(r.Key)
	if len(r.Value) > 0 {
		e.Payload = json.RawMessage(r.Value)
	}
	for _, h := range r.Headers {
		switch h.Key {
		case HeaderVariant:
			e.Variant = string(h.Value)
		case HeaderType:
			e.Type = string(h.Value)
		case HeaderOccurredAt:
			t, err := time.Parse(time.RFC3339Nano, string(h.Value))
			if err != nil {
				return e, fmt.Errorf("record %d of %s: header %s: %w", r.Offset, r.Topic, h.Key, err)
			}
			e.OccurredAt = t
		case HeaderSequence:
			n, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return e, fmt.Errorf("record %d of %s: header %s: %w", r.Offset, r.Topic, h.Key, err)
			}
			e.Sequence = &n
		case HeaderMetadata:
			e.Metadata = json.RawMessage(h.Value)
		case HeaderDeliveryHandle:
			e.DeliveryHandle = json.RawMessage(h.Value)
		}
	}
	return e, nil
}
