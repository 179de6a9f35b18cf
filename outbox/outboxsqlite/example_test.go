package outboxsqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// A Go program on an edge device writes its events to a durable outbox and
// relays them to the control plane; each event leaves the outbox only on
// the control plane's ACK. (This example has no server to talk to, so the
// event stays pending.)
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example-*")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	store, err := outboxsqlite.Open(filepath.Join(dir, "outbox.db"), outboxsqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait(); store.Close() }()
	wg.Go(func() { store.Run(ctx) }) // the group-commit writer of inserts

	pub, err := client.NewPublisher("ws://127.0.0.1:1", client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	wg.Go(func() { relay.Run(ctx) })

	res, err := store.Insert(ctx, []postbox.Envelope{{
		SchemaVersion: postbox.SchemaVersion,
		EventID:       outbox.NewEventID(),
		Type:          "sensor.reading",
		TS:            time.Now().UTC().Format(time.RFC3339Nano),
		SessionID:     "sess_boot_1",
		DeviceID:      "pi-01",
		Payload:       json.RawMessage(`{"celsius":21.5}`),
	}})
	if err != nil {
		log.Fatal(err)
	}
	pending, _, _ := store.Counts(context.Background())
	fmt.Println(len(res), "queued;", pending, "pending until the control plane ACKs it")
	// Output: 1 queued; 1 pending until the control plane ACKs it
}
