package outboxkafka_test

import (
	"testing"

	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the publisher suite on an in-process Kafka broker
// (kfake). Kafka's idempotent producer removes duplicates within one
// producer session only, so a batch sent again is produced again.
func TestSuite(t *testing.T) {
	outboxtest.RunPublisher(t, outboxtest.PublisherFeatures{}, func(t *testing.T) outboxtest.Target {
		c := kafkatest.Start(t, 1)
		c.CreateTopic("orders", 3, nil)
		p := newPublisher(t, c, outboxkafka.Config{Topic: "orders"})
		return outboxtest.Target{Publisher: p, ReadBack: func(t *testing.T) []outboxtest.Received {
			n := c.Count("orders") // every ACKed record is there
			if n == 0 {
				return nil
			}
			var out []outboxtest.Received
			for _, r := range c.Read("orders", int(n)) {
				out = append(out, outboxtest.Received{EventID: header(r, outboxkafka.HeaderEventID),
					Type: header(r, outboxkafka.HeaderEventType), Payload: r.Value})
			}
			return out
		}}
	})
}
