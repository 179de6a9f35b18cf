package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
)

// relayBenchRound is one timed relay of the whole outbox.
type relayBenchRound struct {
	Relays     int     `json:"relays"`
	Events     int     `json:"events"`
	Delivered  int64   `json:"delivered"`
	DurationS  float64 `json:"duration_s"`
	EventsPerS float64 `json:"events_per_s"`
}

func runBenchRelay(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench relay", "--db postgres://... --to URL [flags]", `Measures postbox relay: inserts --events rows into a transactional outbox in a schema of its own
(postbox_bench_PID, dropped at the end), then times relays, run in this process, until every row is
delivered. Each count in --relays is timed --rounds times, alternating, so that they can be compared
as ratios of one run. The target gets its own stream (redis: STREAM-bench-PID, deleted at the end;
kafka: a topic TOPIC-postbox-bench-PID, created with the brokers' default partitions and deleted).
--json prints one JSON object as the last line of stdout.`)
	dsn := fs.String("db", "", "PostgreSQL: postgres://... [DATABASE_URL]")
	to := fs.String("to", "", "relay target, as for postbox relay (redis://...?stream=NAME, nats://...?stream=NAME, kafka://...?topic=NAME, ws://...)")
	events := positiveInt(100000)
	fs.Var(&events, "events", "`rows` per round")
	rounds := positiveInt(3)
	fs.Var(&rounds, "rounds", "timed `rounds` per relay count")
	relaysFlag := fs.String("relays", "1,3", "comma-separated relay counts to compare")
	batch := positiveInt(1000)
	fs.Var(&batch, "batch", "most `events` per publish")
	window := positiveInt(8000)
	fs.Var(&window, "max-in-flight", "most `events` in flight per relay")
	payloadBytes := positiveInt(200)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each payload in `bytes`")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := envDefaults(env, fs, map[string]string{"db": "DATABASE_URL"}); err != nil {
		return err
	}
	if !isPostgres(*dsn) || *to == "" {
		return usagef("bench relay: --db postgres://... and --to are required")
	}
	var counts []int
	for _, f := range strings.Split(*relaysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return usagef("bench relay: --relays %q: want counts like 1,3", *relaysFlag)
		}
		counts = append(counts, n)
	}
	schema := fmt.Sprintf("postbox_bench_%d", os.Getpid())
	target, cleanTarget, err := benchTarget(*to, schema)
	if err != nil {
		return err
	}
	pool, err := benchPool(ctx, *dsn, schema)
	if err != nil {
		return err
	}
	defer func() {
		pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
		cleanTarget()
	}()
	payload := string(benchPayload(int(payloadBytes)))

	var results []relayBenchRound
	for round := range int(rounds) {
		for _, n := range counts {
			if err := fillOutbox(ctx, pool, int(events), payload); err != nil {
				return err
			}
			res, err := benchRelayRound(ctx, *dsn, schema, target, n, int(events), int(batch), int(window))
			if err != nil {
				return err
			}
			results = append(results, res)
			fmt.Fprintf(env.stderr, "round %d: %d relay(s): %d events in %.2fs, %.0f events/s\n", round+1, n, res.Delivered, res.DurationS, res.EventsPerS)
		}
	}
	medians := map[int]float64{}
	for _, n := range counts {
		var rates []float64
		for _, r := range results {
			if r.Relays == n {
				rates = append(rates, r.EventsPerS)
			}
		}
		slices.Sort(rates)
		medians[n] = rates[len(rates)/2]
		fmt.Fprintf(env.stdout, "%d relay(s): median %.0f events/s over %d rounds (%.0f–%.0f)\n", n, medians[n], len(rates), rates[0], rates[len(rates)-1])
	}
	if len(counts) > 1 {
		fmt.Fprintf(env.stdout, "ratio %d:%d relays = %.2f\n", counts[len(counts)-1], counts[0], medians[counts[len(counts)-1]]/medians[counts[0]])
	}
	if *asJSON {
		b, _ := json.Marshal(map[string]any{"rounds": results, "median_events_per_s": medians})
		fmt.Fprintln(env.stdout, string(b))
	}
	return nil
}

// benchPool opens a pool whose search_path is schema, created if missing.
func benchPool(ctx context.Context, dsn, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("--db: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("--db %s: %w", redact(dsn), err)
	}
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// fillOutbox empties the outbox and inserts n rows, 1000 per transaction.
func fillOutbox(ctx context.Context, pool *pgxpool.Pool, n int, payload string) error {
	if _, err := pool.Exec(ctx, "TRUNCATE outbox"); err != nil {
		return err
	}
	for i := 0; i < n; i += 1000 {
		es := make([]outbox.Event, min(1000, n-i))
		for j := range es {
			es[j] = outbox.Event{Type: "bench.event", Payload: []byte(payload)}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outboxpg.InsertPgx(ctx, tx, es...) }); err != nil {
			return fmt.Errorf("fill outbox: %w", err)
		}
	}
	_, err := pool.Exec(ctx, "VACUUM ANALYZE outbox")
	return err
}

// benchRelayRound runs n relays, each with its own pool and publisher,
// until every row is delivered.
func benchRelayRound(ctx context.Context, dsn, schema, to string, n, events, batch, window int) (relayBenchRound, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var delivered atomic.Int64
	done := make(chan struct{})
	g, gctx := errgroup.WithContext(ctx)
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	var relays []*outbox.Relay
	for range n {
		pool, err := benchPool(ctx, dsn, schema)
		if err != nil {
			return relayBenchRound{}, err
		}
		closers = append(closers, pool.Close)
		store, err := outboxpg.New(pool, outboxpg.Config{Retention: -1})
		if err != nil {
			return relayBenchRound{}, err
		}
		pub, closePub, err := relayTarget(ctx, to, "", 10*time.Second)
		if err != nil {
			return relayBenchRound{}, err
		}
		closers = append(closers, closePub)
		if strings.HasPrefix(to, "ws") {
			pub = outbox.Envelopes(pub)
		}
		r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: batch, MaxInFlight: window,
			Observe: func(st outbox.Stats) {
				if delivered.Add(int64(st.Delivered)) == int64(events) {
					close(done)
				}
			}})
		if err != nil {
			return relayBenchRound{}, err
		}
		relays = append(relays, r)
		g.Go(func() error { return store.Run(gctx) })
	}
	start := time.Now()
	for _, r := range relays {
		g.Go(func() error { return r.Run(gctx) })
	}
	select {
	case <-done:
	case <-ctx.Done():
		return relayBenchRound{}, ctx.Err()
	}
	d := time.Since(start)
	cancel()
	g.Wait()
	return relayBenchRound{Relays: n, Events: events, Delivered: delivered.Load(), DurationS: d.Seconds(), EventsPerS: float64(events) / d.Seconds()}, nil
}

// benchTarget gives a redis:// or nats:// target a stream of the bench's
// own and returns a function that deletes it.
func benchTarget(to, suffix string) (string, func(), error) {
	u, err := url.Parse(to)
	if err != nil {
		return "", nil, usagef("--to %q: %v", to, err)
	}
	q := u.Query()
	if u.Scheme == "kafka" {
		return benchTopic(u, suffix)
	}
	stream := q.Get("stream")
	if stream == "" || !(u.Scheme == "redis" || u.Scheme == "nats") {
		return to, func() {}, nil
	}
	own := stream + "-" + strings.ReplaceAll(suffix, "_", "-")
	if u.Scheme == "nats" {
		own = stream + "_" + suffix
	}
	q.Set("stream", own)
	u.RawQuery = q.Encode()
	return u.String(), func() { deleteBenchStream(u) }, nil
}

func deleteBenchStream(u *url.URL) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := u.Query()
	stream := q.Get("stream")
	q.Del("stream")
	u.RawQuery = q.Encode()
	switch u.Scheme {
	case "redis":
		if opts, err := redis.ParseURL(u.String()); err == nil {
			rc := redis.NewClient(opts)
			rc.Del(ctx, stream)
			rc.Close()
		}
	case "nats":
		if nc, err := nats.Connect(u.String()); err == nil {
			if js, err := jetstream.New(nc); err == nil {
				js.DeleteStream(ctx, stream)
			}
			nc.Close()
		}
	}
}

// benchTopic gives a kafka:// target a topic of the bench's own, created
// now, and returns a function that deletes it.
func benchTopic(u *url.URL, suffix string) (string, func(), error) {
	q := u.Query()
	topic := q.Get("topic")
	if topic == "" {
		return "", nil, usagef("--to %s: name the topic: kafka://HOST:9092?topic=NAME", redact(u.String()))
	}
	own := topic + "-" + strings.ReplaceAll(suffix, "_", "-")
	q.Set("topic", own)
	u.RawQuery = q.Encode()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(u.Host, ",")...))
	if err != nil {
		return "", nil, usagef("--to %s: %v", redact(u.String()), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = own, -1, -1
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		cl.Close()
		return "", nil, fmt.Errorf("--to %s: create topic %s: %w", redact(u.String()), own, err)
	}
	return u.String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		del := kmsg.NewPtrDeleteTopicsRequest()
		dt := kmsg.NewDeleteTopicsRequestTopic()
		dt.Topic = kmsg.StringPtr(own)
		del.Topics, del.TopicNames = append(del.Topics, dt), append(del.TopicNames, own)
		del.RequestWith(ctx, cl)
		cl.Close()
	}, nil
}
