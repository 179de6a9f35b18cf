package outboxredis_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"log"
	"os"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/postbox-events/postbox/dedup"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxredis"
)

// A relay appends an outbox's events to the Redis stream "orders", keeping
// about the last million. (It needs a Redis server, so it is compiled, not
// run.)
func ExamplePublisher() {
	var store outbox.Store // an outbox: outboxpg, outboxsqlite

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pub, err := outboxredis.NewPublisher(rdb, outboxredis.Config{Stream: "orders", MaxLen: 1_000_000})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{MaxAttempts: 20})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(relay.Run(context.Background()))
}

// A billing service invoices each order once, however often the stream
// delivers its event (a relay that resent it, a consumer that died before
// its XACK): the invoice and the inbox record of dedup.Handle commit in one
// transaction, and a delivery of an event already handled changes nothing.
// (It needs a Redis server, so it is compiled, not run.)
func ExampleConsumer() {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:billing.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := dedup.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS invoices (order_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	consumer, err := outboxredis.NewConsumer(rdb, outboxredis.ConsumerConfig{
		Stream:   "orders",
		Group:    "billing",
		Consumer: os.Getenv("POD_NAME"), // stable across restarts
		Start:    "0",                   // a new group starts with the events already there
		Handler: func(ctx context.Context, m outboxredis.Message) error {
			if m.Type != "order.created" {
				return nil
			}
			var order struct {
				ID          string `json:"id"`
				AmountCents int64  `json:"amount_cents"`
			}
			if err := json.Unmarshal(m.Payload, &order); err != nil {
				return err // retried, then dead-lettered to orders:dead
			}
			_, err := dedup.Handle(ctx, db, "billing", m.EventID, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)`, order.ID, order.AmountCents)
				return err
			})
			return err // nil: acknowledged; an error: delivered again after MinIdle
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(consumer.Run(ctx))
}
