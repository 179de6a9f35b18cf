package bench

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
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

// RelayConfig is a run of Relay. Counts are positive; the caller
// validates them.
type RelayConfig struct {
	DSN string // the PostgreSQL holding the outbox, postgres://…
	// To is the relay target, as postbox relay takes it (redis://…?stream=,
	// nats://…?stream=, kafka://…?topic=, ws://…). A redis or nats stream
	// and a kafka topic are replaced by ones of the run's own, deleted at
	// the end.
	To string

	Events       int   // outbox rows per round
	Rounds       int   // timed rounds per relay count
	Relays       []int // relay counts to compare, each timed Rounds times, alternating
	Batch        int   // most events per publish
	MaxInFlight  int   // most events in flight per relay
	PayloadBytes int   // approximate size of each payload

	// Target opens the publisher of a relay to to, as postbox relay does,
	// and returns a function that closes it.
	Target func(ctx context.Context, to string) (outbox.Publisher, func(), error)

	Progress io.Writer // a line per round; nil: discarded
}

// RelayRound is one timed relay of the whole outbox.
type RelayRound struct {
	Relays     int     `json:"relays"`
	Events     int     `json:"events"`
	Delivered  int64   `json:"delivered"`
	DurationS  float64 `json:"duration_s"`
	EventsPerS float64 `json:"events_per_s"`
}

// RelayResult is every round Relay timed, in the order it ran them.
type RelayResult struct {
	Rounds []RelayRound
}

// Rates returns the events/s of the rounds of n relays, sorted.
func (r *RelayResult) Rates(n int) []float64 {
	var rates []float64
	for _, rd := range r.Rounds {
		if rd.Relays == n {
			rates = append(rates, rd.EventsPerS)
		}
	}
	slices.Sort(rates)
	return rates
}

// Median returns the median events/s of the rounds of n relays (the
// upper one of an even count), or 0 when there were none.
func (r *RelayResult) Median(n int) float64 {
	rates := r.Rates(n)
	if len(rates) == 0 {
		return 0
	}
	return rates[len(rates)/2]
}

// Relay inserts cfg.Events rows into a transactional outbox in a schema
// of its own (postbox_bench_PID, dropped at the end) and times relays,
// run in this process, until every row is delivered: each count of
// cfg.Relays cfg.Rounds times, alternating, so that they can be compared
// as ratios of one run.
func Relay(ctx context.Context, cfg RelayConfig) (*RelayResult, error) {
	progress := progressOut(cfg.Progress)
	if cfg.Target == nil {
		return nil, fmt.Errorf("bench relay: no Target to publish with")
	}
	schema := fmt.Sprintf("postbox_bench_%d", os.Getpid())
	target, cleanTarget, err := relayTarget(cfg.To, schema)
	if err != nil {
		return nil, err
	}
	pool, err := outboxPool(ctx, cfg.DSN, schema)
	if err != nil {
		return nil, err
	}
	defer func() {
		pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		pool.Close()
		cleanTarget()
	}()
	payload := string(agentPayload(cfg.PayloadBytes))

	res := &RelayResult{}
	for round := range cfg.Rounds {
		for _, n := range cfg.Relays {
			if err := fillOutbox(ctx, pool, cfg.Events, payload); err != nil {
				return nil, err
			}
			rd, err := relayRound(ctx, cfg, schema, target, n)
			if err != nil {
				return nil, err
			}
			res.Rounds = append(res.Rounds, rd)
			fmt.Fprintf(progress, "round %d: %d relay(s): %d events in %.2fs, %.0f events/s\n", round+1, n, rd.Delivered, rd.DurationS, rd.EventsPerS)
		}
	}
	return res, nil
}

// outboxPool opens a pool whose search_path is schema, created if missing.
func outboxPool(ctx context.Context, dsn, schema string) (*pgxpool.Pool, error) {
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

// relayRound runs n relays to target, each with its own pool and
// publisher, until every row is delivered.
func relayRound(ctx context.Context, cfg RelayConfig, schema, target string, n int) (RelayRound, error) {
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
		pool, err := outboxPool(ctx, cfg.DSN, schema)
		if err != nil {
			return RelayRound{}, err
		}
		closers = append(closers, pool.Close)
		store, err := outboxpg.New(pool, outboxpg.Config{Retention: -1})
		if err != nil {
			return RelayRound{}, err
		}
		pub, closePub, err := cfg.Target(ctx, target)
		if err != nil {
			return RelayRound{}, err
		}
		closers = append(closers, closePub)
		r, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: cfg.Batch, MaxInFlight: cfg.MaxInFlight,
			Observe: func(st outbox.Stats) {
				if delivered.Add(int64(st.Delivered)) == int64(cfg.Events) {
					close(done)
				}
			}})
		if err != nil {
			return RelayRound{}, err
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
		return RelayRound{}, ctx.Err()
	}
	d := time.Since(start)
	cancel()
	g.Wait()
	return RelayRound{Relays: n, Events: cfg.Events, Delivered: delivered.Load(), DurationS: d.Seconds(), EventsPerS: float64(cfg.Events) / d.Seconds()}, nil
}

// relayTarget gives a redis:// or nats:// target a stream of the bench's
// own, and a kafka:// one a topic, and returns a function that deletes it.
func relayTarget(to, suffix string) (string, func(), error) {
	u, err := url.Parse(to)
	if err != nil {
		return "", nil, usagef("--to %q: %v", to, err)
	}
	q := u.Query()
	if u.Scheme == "kafka" {
		return relayTopic(u, suffix)
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
	return u.String(), func() { deleteRelayStream(u) }, nil
}

// deleteRelayStream deletes the stream of a redis:// or nats:// target.
func deleteRelayStream(u *url.URL) {
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

// relayTopic gives a kafka:// target a topic of the bench's own, created
// now, and returns a function that deletes it.
func relayTopic(u *url.URL, suffix string) (string, func(), error) {
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
