package outboxnats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxnats"
)

// A relay sends an outbox's events into the JetStream stream ORDERS, on
// subjects ORDERS.<event type>, creating the stream if it is missing.
// (It needs a NATS server, so it is compiled, not run.)
func Example() {
	var store outbox.Store // an outbox: outboxsqlite, or a service's database

	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outboxnats.NewPublisher(js, outboxnats.Config{Stream: "ORDERS", CreateStream: true})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(relay.Run(context.Background()))
}
