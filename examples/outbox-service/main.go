// Command outbox-service is a small order service that uses postbox's
// transactional outbox end to end:
//
//  1. It places orders: each order row and its "order.placed" event are
//     written in one PostgreSQL transaction (outboxpg.InsertPgx), so a failed
//     transaction leaves neither.
//  2. A relay (outbox.Relay over outboxpg, publishing with outboxredis)
//     moves the events to a Redis stream.
//  3. A shipping consumer (outboxredis.Consumer) reads the stream in a
//     consumer group and creates one shipment per order inside
//     dedup.HandlePgx, so an event delivered twice (here: resent on
//     purpose, as a relay does after a crash) ships once.
//
// Run it against the services of a development machine:
//
//	go run ./examples/outbox-service -db 'postgres://postgres@127.0.0.1:5432/test' -redis redis://127.0.0.1:6379/0
//
// It keeps its tables in a schema of its own (-schema, outbox_example) and
// starts from an empty stream (-stream, outbox-example-orders), which it
// deletes first: point it at nothing you want to keep.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/dedup"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxredis"
)

type config struct {
	DB, Schema, Redis, Stream string
	Orders, Resend            int
	Out                       io.Writer
}

// summary is what a run did.
type summary struct {
	Placed, RolledBack, Relayed, StreamEntries, Shipments, SkippedDuplicates int
}

func main() {
	cfg := config{Out: os.Stdout}
	flag.StringVar(&cfg.DB, "db", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"), "PostgreSQL URL [DATABASE_URL]")
	flag.StringVar(&cfg.Redis, "redis", envOr("REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis URL [REDIS_URL]")
	flag.StringVar(&cfg.Schema, "schema", "outbox_example", "PostgreSQL schema for the example's tables, created if missing; empty: the URL's search_path")
	flag.StringVar(&cfg.Stream, "stream", "outbox-example-orders", "Redis stream, deleted first")
	flag.IntVar(&cfg.Orders, "orders", 100, "orders to place")
	flag.IntVar(&cfg.Resend, "resend", 10, "events to publish a second time, as a relay does after a crash")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-service:", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// openPool connects to db with schema (created if missing) first in the
// search_path; with schema empty, as db says.
func openPool(ctx context.Context, db, schema string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(db)
	if err != nil {
		return nil, err
	}
	if schema != "" {
		conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig.Copy())
		if err != nil {
			return nil, err
		}
		_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
		conn.Close(ctx)
		if err != nil {
			return nil, err
		}
		pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	return pgxpool.NewWithConfig(ctx, pcfg)
}

func run(ctx context.Context, cfg config) (summary, error) {
	var sum summary
	log := slog.New(slog.NewTextHandler(cfg.Out, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := openPool(ctx, cfg.DB, cfg.Schema)
	if err != nil {
		return sum, err
	}
	defer pool.Close()
	ropts, err := redis.ParseURL(cfg.Redis)
	if err != nil {
		return sum, err
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()

	// The example starts from an empty stream (and so a new consumer group).
	if err := rdb.Del(ctx, cfg.Stream).Err(); err != nil {
		return sum, err
	}
	// Schema: the outbox, the dedup inbox, and the service's own tables.
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		return sum, err
	}
	if _, err := pool.Exec(ctx, dedup.PostgresSchema); err != nil {
		return sum, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, total_cents INT NOT NULL);
		CREATE TABLE IF NOT EXISTS shipments (order_id TEXT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return sum, err
	}

	// 1. Place orders: the order and its event commit together.
	placed := map[string]bool{}
	for i := range cfg.Orders {
		id := fmt.Sprintf("order-%d-%d", time.Now().UnixNano(), i)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, id, 1000+i); err != nil {
				return err
			}
			return outboxpg.InsertPgx(ctx, tx, outbox.Event{Type: "order.placed", TenantID: "shop-1",
				Payload: fmt.Appendf(nil, `{"order_id":%q,"total_cents":%d}`, id, 1000+i)})
		})
		if err != nil {
			return sum, fmt.Errorf("place %s: %w", id, err)
		}
		placed[id] = true
	}
	sum.Placed = len(placed)
	// A transaction that fails after its outbox insert leaves no event.
	errPayment := errors.New("payment declined")
	declined := fmt.Sprintf("declined-%d", time.Now().UnixNano())
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, 1)`, declined); err != nil {
			return err
		}
		if err := outboxpg.InsertPgx(ctx, tx, outbox.Event{Type: "order.placed", Payload: fmt.Appendf(nil, `{"order_id":%q}`, declined)}); err != nil {
			return err
		}
		return errPayment
	})
	if !errors.Is(err, errPayment) {
		return sum, fmt.Errorf("declined order: %v", err)
	}
	sum.RolledBack = 1

	// 2. Relay the outbox to Redis, and 3. ship each order once.
	store, err := outboxpg.New(pool, outboxpg.Config{Logger: log})
	if err != nil {
		return sum, err
	}
	pub, err := outboxredis.NewPublisher(rdb, outboxredis.Config{Stream: cfg.Stream})
	if err != nil {
		return sum, err
	}
	var relayed int
	relayedCh := make(chan int, 64)
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{Logger: log, PollInterval: 200 * time.Millisecond,
		Observe: func(st outbox.Stats) { relayedCh <- st.Delivered }})
	if err != nil {
		return sum, err
	}
	shipped := make(chan string, cfg.Orders)
	skipped := make(chan string, cfg.Orders+cfg.Resend)
	consumer, err := outboxredis.NewConsumer(rdb, outboxredis.ConsumerConfig{
		Stream: cfg.Stream, Group: "shipping", Consumer: "shipping-1", Start: "0", Block: 100 * time.Millisecond, Logger: log,
		Handler: func(ctx context.Context, m outboxredis.Message) error {
			ran, err := dedup.HandlePgx(ctx, pool, "shipping", m.EventID, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1::jsonb->>'order_id')`, string(m.Payload))
				return err
			})
			switch {
			case err != nil:
				return err
			case ran:
				shipped <- m.EventID
			default:
				skipped <- m.EventID
			}
			return nil
		},
	})
	if err != nil {
		return sum, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return store.Run(gctx) })
	g.Go(func() error { return relay.Run(gctx) })
	g.Go(func() error { return consumer.Run(gctx) })

	wait := func(what string, done func() bool) error {
		for !done() {
			select {
			case n := <-relayedCh:
				relayed += n
			case <-shipped:
				sum.Shipments++
			case <-skipped:
				sum.SkippedDuplicates++
			case <-gctx.Done():
				return fmt.Errorf("waiting for %s: %w", what, context.Cause(gctx))
			}
		}
		return nil
	}
	err = wait("every order to ship", func() bool { return sum.Shipments == cfg.Orders && relayed == cfg.Orders })
	if err == nil && cfg.Resend > 0 {
		// A relay that dies after publishing and before marking rows
		// delivered sends them again. Do that on purpose.
		rows, lerr := store.List(ctx, outbox.StateDelivered, cfg.Resend)
		if lerr != nil {
			err = lerr
		} else {
			var msgs []outbox.Message
			for _, r := range rows {
				msgs = append(msgs, outbox.Message{EventID: r.EventID, Type: r.Type, Body: r.Payload, TenantID: r.TenantID, CorrelationID: r.CorrelationID, CreatedAt: r.CreatedAt})
			}
			if _, err = pub.Publish(ctx, msgs); err == nil {
				err = wait("the resent events", func() bool { return sum.SkippedDuplicates == len(msgs) })
			}
		}
	}
	cancel()
	if werr := g.Wait(); err == nil && werr != nil && !errors.Is(werr, context.Canceled) {
		err = werr
	}
	if err != nil {
		return sum, err
	}
	sum.Relayed = relayed
	n, err := rdb.XLen(context.Background(), cfg.Stream).Result()
	if err != nil {
		return sum, err
	}
	sum.StreamEntries = int(n)
	fmt.Fprintf(cfg.Out, "orders placed:            %d (+%d rolled back with its event)\n", sum.Placed, sum.RolledBack)
	fmt.Fprintf(cfg.Out, "events relayed to Redis:  %d (stream %q now holds %d entries, %d of them resent)\n", sum.Relayed, cfg.Stream, sum.StreamEntries, cfg.Resend)
	fmt.Fprintf(cfg.Out, "shipments created:        %d (duplicates skipped by dedup: %d)\n", sum.Shipments, sum.SkippedDuplicates)
	return sum, nil
}
