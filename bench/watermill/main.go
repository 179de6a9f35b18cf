// Command watermill measures, in one run and on the same PostgreSQL and
// Redis, how fast two transactional outboxes move events that are already
// committed into a Redis stream:
//
//   - Watermill: watermill-sql's publisher inside the caller's *sql.Tx
//     (pgx stdlib, PostgreSQL schema adapter), wrapped by the forwarder
//     component's publisher, and the forwarder (watermill-sql subscriber →
//     watermill-redisstream publisher);
//   - postbox: outboxpg.InsertPgx inside the caller's pgx.Tx, and an
//     outbox.Relay from an outboxpg.Store to an outboxredis.Publisher.
//
// Each round, each side gets a fresh schema and stream, N events are
// inserted first (in transactions of -tx events), and then the clock runs
// from starting the forwarder (relay) until XLEN of its stream reaches N.
// The sides take turns going first. The table shows events/s per round and
// side, and the median ratio postbox/watermill.
//
// It is a module of its own so that postbox's go.mod and `go test ./...`
// carry none of Watermill's dependencies.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for Watermill
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
)

// Where each side keeps its rows and entries; dropped before every run
// and at the end.
const (
	wmSchema    = "bench_watermill"
	wmTopic     = "outbox" // the forwarder's SQL topic: table bench_watermill.watermill_outbox
	pbSchema    = "bench_postbox"
	eventType   = "order.created"
	pollEvery   = 5 * time.Millisecond // XLEN polls while waiting for the last event
	defaultPG   = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRdb  = "redis://127.0.0.1:6379/0"
	sidePostbox = "postbox"
	sideWM      = "watermill"
)

type config struct {
	n, rounds, tx, payload int
	pg, redis              string
	kafka                  bool
	brokers                string
	partitions             int
	timeout                time.Duration
	keep                   bool
	only                   string
}

// result is one side's run: how long the inserts took, and the forward
// from start until the stream held N entries.
type result struct {
	insert, forward time.Duration
	// settle is from XLEN = N until the outbox knows it: every postbox row
	// marked delivered, Watermill's offset acked past the last message.
	settle time.Duration
	xlen   int64
}

func main() {
	var cfg config
	flag.IntVar(&cfg.n, "n", 100_000, "events per run")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs both sides, taking turns going first")
	flag.IntVar(&cfg.tx, "tx", 100, "events per insert transaction")
	flag.IntVar(&cfg.payload, "payload", 200, "bytes of each event's JSON payload")
	flag.StringVar(&cfg.pg, "pg", defaultPG, "PostgreSQL URL (schemas "+wmSchema+" and "+pbSchema+" are dropped and recreated)")
	flag.StringVar(&cfg.redis, "redis", defaultRdb, "Redis URL (keys bench:watermill and bench:postbox are deleted)")
	flag.BoolVar(&cfg.kafka, "kafka", false, "forward to Kafka instead of Redis")
	flag.StringVar(&cfg.brokers, "brokers", "", "-kafka: host:port[,host:port]; empty: a kfake broker started in this process on loopback")
	flag.IntVar(&cfg.partitions, "partitions", 1, "-kafka: partitions of each run's topic")
	serve := flag.String("serve-kafka", "", "only run a kfake broker on this host:port until interrupted (for postbox bench relay --to kafka://)")
	flag.DurationVar(&cfg.timeout, "timeout", 10*time.Minute, "give up on a run after this long")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the last round's schemas and streams")
	flag.StringVar(&cfg.only, "only", "", "run one side only: "+sideWM+" or "+sidePostbox+" (no ratio)")
	flag.Parse()
	if *serve != "" {
		if err := serveKafka(*serve); err != nil {
			fmt.Fprintln(os.Stderr, "watermill:", err)
			os.Exit(1)
		}
		return
	}
	if cfg.n <= 0 || cfg.rounds <= 0 || cfg.tx <= 0 || cfg.payload < 100 || (cfg.only != "" && cfg.only != sideWM && cfg.only != sidePostbox) {
		fmt.Fprintln(os.Stderr, "watermill: -n, -rounds and -tx must be positive, -payload at least 100, -only watermill or postbox")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "watermill:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	db, err := sql.Open("pgx", cfg.pg)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	var snk sink
	if cfg.kafka {
		snk, err = newKafkaSink(cfg.brokers, cfg.partitions)
	} else {
		snk, err = newRedisSink(ctx, cfg.redis)
	}
	if err != nil {
		return err
	}
	defer snk.close()
	var pgVersion string
	db.QueryRowContext(ctx, "SHOW server_version").Scan(&pgVersion)
	fmt.Fprintf(out, "PostgreSQL %s → %s: %d events of %d-byte JSON per run, inserted in transactions of %d, %d rounds\n",
		pgVersion, snk.describe(ctx), cfg.n, cfg.payload, cfg.tx, cfg.rounds)
	if cfg.kafka {
		fmt.Fprintf(out, "watermill v1.5.1 forwarder (watermill-sql v4.0.0 → watermill-kafka v3.0.6, sarama SyncProducer, acks=all) vs postbox outbox.Relay (outboxpg → outboxkafka, franz-go, idempotent, acks=all), defaults otherwise\n\n")
	} else {
		fmt.Fprintf(out, "watermill v1.5.1 forwarder (watermill-sql v4.0.0 → watermill-redisstream v1.4.5) vs postbox outbox.Relay (outboxpg → outboxredis), defaults on both sides\n\n")
	}

	events := makeEvents(cfg.n, cfg.payload)
	results := map[string][]result{}
	for round := range cfg.rounds {
		sides := []string{sideWM, sidePostbox}
		if round%2 == 1 {
			slices.Reverse(sides)
		}
		if cfg.only != "" {
			sides = []string{cfg.only}
		}
		for _, side := range sides {
			rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
			var r result
			var err error
			if side == sideWM {
				r, err = runWatermill(rctx, cfg, db, snk, round, events)
			} else {
				r, err = runPostbox(rctx, cfg, db, snk, round, events)
			}
			cancel()
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, side, err)
			}
			results[side] = append(results[side], r)
			fmt.Fprintf(os.Stderr, "round %d %-9s insert %8.0f ev/s  forward %8.0f ev/s (%s)\n",
				round+1, side, rate(cfg.n, r.insert), rate(cfg.n, r.forward), r.forward.Round(time.Millisecond))
		}
	}
	if !cfg.keep {
		cleanup(context.WithoutCancel(ctx), db, snk)
	}
	if cfg.only == "" {
		report(out, cfg, results)
	}
	return nil
}

func report(out io.Writer, cfg config, results map[string][]result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tfirst\twatermill insert ev/s\twatermill forward ev/s\tpostbox insert ev/s\tpostbox forward ev/s\tpostbox/watermill\t")
	var ratios []float64
	for i := range cfg.rounds {
		wm, pb := results[sideWM][i], results[sidePostbox][i]
		first := sideWM
		if i%2 == 1 {
			first = sidePostbox
		}
		ratio := rate(cfg.n, pb.forward) / rate(cfg.n, wm.forward)
		ratios = append(ratios, ratio)
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t\n", i+1, first,
			rate(cfg.n, wm.insert), rate(cfg.n, wm.forward), rate(cfg.n, pb.insert), rate(cfg.n, pb.forward), ratio)
	}
	fmt.Fprintf(tw, "median\t\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f\t\n",
		median(rates(cfg.n, results[sideWM], false)), median(rates(cfg.n, results[sideWM], true)),
		median(rates(cfg.n, results[sidePostbox], false)), median(rates(cfg.n, results[sidePostbox], true)), median(ratios))
	tw.Flush()
	settle := func(side string) float64 {
		var ms []float64
		for _, r := range results[side] {
			ms = append(ms, float64(r.settle.Milliseconds()))
		}
		return median(ms)
	}
	fmt.Fprintf(out, "\nforward: from starting the forwarder (relay) until the stream (topic) holds %d. Not timed: the outbox then knew it a median %.0f ms (watermill: offset acked) and %.0f ms (postbox: rows marked delivered) later.\n",
		cfg.n, settle(sideWM), settle(sidePostbox))
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func rates(n int, rs []result, forward bool) []float64 {
	var out []float64
	for _, r := range rs {
		d := r.insert
		if forward {
			d = r.forward
		}
		out = append(out, rate(n, d))
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// event is one event, the same on both sides.
type event struct {
	id, correlationID, tenantID string
	payload                     []byte
}

// makeEvents returns n events whose JSON payloads are size bytes each.
func makeEvents(n, size int) []event {
	events := make([]event, n)
	for i := range events {
		p := fmt.Sprintf(`{"order_id":"ord_%08d","customer_id":"cus_%06d","amount_cents":%d,"currency":"EUR","items":[{"sku":"sku-%04d","qty":%d}],"note":"`,
			i, i%100_000, 1000+i%9000, i%1000, 1+i%5)
		pad := max(0, size-len(p)-2)
		events[i] = event{
			id:            outbox.NewEventID(),
			correlationID: fmt.Sprintf("req_%08d", i/10),
			tenantID:      fmt.Sprintf("tenant_%02d", i%16),
			payload:       []byte(p + strings.Repeat("x", pad) + `"}`),
		}
	}
	return events
}

// resetSchema drops and recreates schema.
func resetSchema(ctx context.Context, db *sql.DB, schema string) error {
	_, err := db.ExecContext(ctx, fmt.Sprintf(`DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s`, schema, schema))
	return err
}

func cleanup(ctx context.Context, db *sql.DB, snk sink) {
	for _, s := range []string{wmSchema, pbSchema} {
		if _, err := db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
		}
	}
	snk.cleanup(ctx)
}

// waitXLen polls the length of stream until it reaches n, failing when
// ctx ends or failed receives (the forwarder or relay stopped early).
func waitXLen(ctx context.Context, snk sink, stream string, n int64, failed <-chan error) (int64, error) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		l, err := snk.count(ctx, stream)
		if err != nil {
			return l, fmt.Errorf("length of %s: %w", stream, err)
		}
		if l >= n {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return l, fmt.Errorf("%d of %d events in %s: %w", l, n, stream, ctx.Err())
		case err := <-failed:
			return l, fmt.Errorf("stopped with %d of %d events in %s: %v", l, n, stream, err)
		case <-tick.C:
		}
	}
}

// poll calls done until it reports true, an error, or ctx ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func wmLogger() watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
}

// runWatermill is one Watermill run: the forwarder's publisher inside
// transactions, then the forwarder to Redis.
func runWatermill(ctx context.Context, cfg config, db *sql.DB, snk sink, run int, events []event) (result, error) {
	var r result
	if err := resetSchema(ctx, db, wmSchema); err != nil {
		return r, err
	}
	wmStream, err := snk.fresh(ctx, sideWM, run)
	if err != nil {
		return r, err
	}
	logger := wmLogger()
	schema := wmsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return fmt.Sprintf(`"%s"."watermill_%s"`, wmSchema, topic) },
	}
	offsets := wmsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return fmt.Sprintf(`"%s"."watermill_offsets_%s"`, wmSchema, topic)
		},
	}
	sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
	}, logger)
	if err != nil {
		return r, err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(wmTopic); err != nil {
		return r, fmt.Errorf("initialize schema: %w", err)
	}

	start := time.Now()
	for i := 0; i < len(events); i += cfg.tx {
		batch := events[i:min(i+cfg.tx, len(events))]
		if err := wmInsert(ctx, db, schema, logger, wmStream, batch); err != nil {
			return r, err
		}
	}
	r.insert = time.Since(start)
	if _, err := db.ExecContext(ctx, "ANALYZE "+schema.MessagesTable(wmTopic)); err != nil {
		return r, err
	}

	pub, err := snk.wmPublisher(logger)
	if err != nil {
		return r, err
	}
	defer pub.Close()
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: wmTopic})
	if err != nil {
		return r, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	start = time.Now()
	go func() { failed <- fwd.Run(runCtx) }()
	r.xlen, err = waitXLen(ctx, snk, wmStream, int64(len(events)), failed)
	r.forward = time.Since(start)
	if err != nil {
		return r, err
	}
	// Not timed: the forwarder commits its offset past the last message.
	acked := fmt.Sprintf(`SELECT COALESCE((SELECT offset_acked FROM %s WHERE consumer_group = ''), 0) >= (SELECT max("offset") FROM %s)`,
		offsets.MessagesOffsetsTable(wmTopic), schema.MessagesTable(wmTopic))
	if err := poll(ctx, func() (bool, error) {
		var ok bool
		err := db.QueryRowContext(ctx, acked).Scan(&ok)
		return ok, err
	}); err != nil {
		return r, fmt.Errorf("waiting for the last offset: %w", err)
	}
	r.settle = time.Since(start) - r.forward
	if err := fwd.Close(); err != nil {
		return r, fmt.Errorf("close forwarder: %w", err)
	}
	cancel()
	if err := <-failed; err != nil && !errors.Is(err, context.Canceled) {
		return r, fmt.Errorf("forwarder: %w", err)
	}
	return r, nil
}

// wmInsert writes one transaction of events the way a Watermill service
// does: a SQL publisher on the transaction, wrapped by the forwarder's
// publisher, which envelopes each message with its destination topic.
func wmInsert(ctx context.Context, db *sql.DB, schema wmsql.SchemaAdapter, logger watermill.LoggerAdapter, wmStream string, batch []event) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	sqlPub, err := wmsql.NewPublisher(wmsql.TxFromStdSQL(tx), wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
	if err != nil {
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: wmTopic})
	msgs := make([]*message.Message, len(batch))
	for i, e := range batch {
		m := message.NewMessage(e.id, e.payload)
		m.Metadata.Set("type", eventType)
		m.Metadata.Set("correlation_id", e.correlationID)
		m.Metadata.Set("tenant_id", e.tenantID)
		m.SetContext(ctx)
		msgs[i] = m
	}
	if err := pub.Publish(wmStream, msgs...); err != nil {
		return fmt.Errorf("watermill publish: %w", err)
	}
	return tx.Commit()
}

// runPostbox is one postbox run: outboxpg.InsertPgx inside transactions, then
// a Relay to Redis.
func runPostbox(ctx context.Context, cfg config, db *sql.DB, snk sink, run int, events []event) (result, error) {
	var r result
	if err := resetSchema(ctx, db, pbSchema); err != nil {
		return r, err
	}
	pbStream, err := snk.fresh(ctx, sidePostbox, run)
	if err != nil {
		return r, err
	}
	pcfg, err := pgxpool.ParseConfig(cfg.pg)
	if err != nil {
		return r, err
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = pbSchema
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return r, err
	}
	defer pool.Close()
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		return r, fmt.Errorf("migrate: %w", err)
	}

	start := time.Now()
	for i := 0; i < len(events); i += cfg.tx {
		batch := events[i:min(i+cfg.tx, len(events))]
		if err := pbInsert(ctx, pool, batch); err != nil {
			return r, err
		}
	}
	r.insert = time.Since(start)
	if _, err := pool.Exec(ctx, "ANALYZE outbox"); err != nil {
		return r, err
	}

	store, err := outboxpg.New(pool, outboxpg.Config{})
	if err != nil {
		return r, err
	}
	pub, closePub, err := snk.pbPublisher(pbStream)
	if err != nil {
		return r, err
	}
	defer closePub()
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{})
	if err != nil {
		return r, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 2)
	done := make(chan struct{}, 2)
	start = time.Now()
	for _, loop := range []func(context.Context) error{store.Run, relay.Run} {
		go func() {
			err := loop(runCtx)
			if runCtx.Err() == nil {
				failed <- fmt.Errorf("returned early: %v", err)
			}
			done <- struct{}{}
		}()
	}
	r.xlen, err = waitXLen(ctx, snk, pbStream, int64(len(events)), failed)
	r.forward = time.Since(start)
	if err != nil {
		return r, err
	}
	// Not timed: the relay marks the last rows delivered.
	if err := poll(ctx, func() (bool, error) {
		pending, rejected, err := store.Counts(ctx)
		if err == nil && rejected > 0 {
			err = fmt.Errorf("%d rows rejected", rejected)
		}
		return pending == 0, err
	}); err != nil {
		return r, fmt.Errorf("waiting for the last rows to be settled: %w", err)
	}
	r.settle = time.Since(start) - r.forward
	cancel()
	<-done
	<-done
	return r, nil
}

func pbInsert(ctx context.Context, pool *pgxpool.Pool, batch []event) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		evs := make([]outbox.Event, len(batch))
		for i, e := range batch {
			evs[i] = outbox.Event{ID: e.id, Type: eventType, Payload: e.payload, CorrelationID: e.correlationID, TenantID: e.tenantID}
		}
		if err := outboxpg.InsertPgx(ctx, tx, evs...); err != nil {
			return fmt.Errorf("postbox insert: %w", err)
		}
		return nil
	})
}

// serveKafka runs a kfake broker on addr until interrupted, topics
// created on first use.
func serveKafka(addr string) error {
	_, port, ok := strings.Cut(addr, ":")
	var p int
	if _, err := fmt.Sscanf(port, "%d", &p); !ok || err != nil {
		return fmt.Errorf("-serve-kafka %q: want host:port", addr)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(p), kfake.AllowAutoTopicCreation())
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintln(os.Stderr, "kfake listening on", strings.Join(c.ListenAddrs(), ","))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}
