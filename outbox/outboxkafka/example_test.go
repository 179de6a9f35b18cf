package outboxkafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
)

// A Publisher relays outbox messages to a topic; here a broker in the
// process (franz-go's kfake) stands in for a Kafka cluster. A Relay
// (outbox.NewRelay(store, pub, cfg)) calls Publish the same way.
func Example() {
	cluster, err := kfake.NewCluster(kfake.SeedTopics(3, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	pub, err := outboxkafka.New(outboxkafka.Config{
		Brokers: cluster.ListenAddrs(),
		Topic:   "orders",
		// Records of one correlation id go to one partition, in order.
		Key: outboxkafka.KeyCorrelationID,
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	replies, err := pub.Publish(ctx, []outbox.Message{
		{EventID: "evt_1", Type: "order.placed", Body: []byte(`{"total":42}`), CorrelationID: "order-7"},
		{EventID: "evt_2", Type: "order.paid", Body: []byte(`{"total":42}`), CorrelationID: "order-7"},
	})
	if err != nil {
		panic(err) // an outage: the relay would wait and send again
	}
	for _, r := range replies {
		fmt.Println(r.EventID, r.OK())
	}
	// Output:
	// evt_1 true
	// evt_2 true
}
