package outboxredis_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/postbox-events/postbox/outbox/outboxredis"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the publisher suite against the Redis of
// POSTBOX_TEST_REDIS. Redis below 8.6 has no IDMP, so a batch sent again
// is appended again.
func TestSuite(t *testing.T) {
	outboxtest.RunPublisher(t, outboxtest.PublisherFeatures{}, func(t *testing.T) outboxtest.Target {
		c := newClient(t)
		stream := newStream(t, c)
		p := newPublisher(t, c, outboxredis.Config{Stream: stream})
		return outboxtest.Target{Publisher: p, ReadBack: func(t *testing.T) []outboxtest.Received {
			entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			out := make([]outboxtest.Received, len(entries))
			for i, e := range entries {
				id, _ := e.Values[outboxredis.FieldEventID].(string)
				typ, _ := e.Values[outboxredis.FieldType].(string)
				payload, _ := e.Values[outboxredis.FieldPayload].(string)
				out[i] = outboxtest.Received{EventID: id, Type: typ, Payload: json.RawMessage(payload)}
			}
			return out
		}}
	})
}
