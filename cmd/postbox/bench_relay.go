package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/bench"
	"github.com/postbox-events/postbox/outbox"
)

func runBenchRelay(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench relay", "--db postgres://... --to URL [flags]", `Measures postbox relay: inserts --events rows into a transactional outbox in a schema of its own
(postbox_bench_PID, dropped at the end), then times relays, run in this process, until every row is
delivered. Each count in --relays is timed --rounds times, alternating, so that they can be compared
as ratios of one run. The target gets its own stream (redis: STREAM-bench-PID, deleted at the end;
kafka: a topic TOPIC-postbox-bench-PID, created with the brokers' default partitions and deleted).
Every event the target acknowledged more than once is counted as a duplicate: with no relay dying,
there must be none, however loaded the machine. --json prints one JSON object as the last line
of stdout.`)
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
	payloadBytes := payloadSize(200)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each payload in `bytes`")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	acks := &ackCounter{acked: map[string]int{}}
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
	res, err := bench.Relay(ctx, bench.RelayConfig{
		DSN: *dsn, To: *to, Events: int(events), Rounds: int(rounds), Relays: counts,
		Batch: int(batch), MaxInFlight: int(window), PayloadBytes: int(payloadBytes),
		Target: func(ctx context.Context, to string) (outbox.Publisher, func(), error) {
			pub, closePub, err := relayTarget(ctx, to, wsOptions{}, 10*time.Second, slog.New(slog.DiscardHandler))
			return acks.count(pub), closePub, err
		},
		Progress: env.stderr,
	})
	if err != nil {
		return benchErr(err)
	}
	medians := map[int]float64{}
	for _, n := range counts {
		rates := res.Rates(n)
		medians[n] = res.Median(n)
		fmt.Fprintf(env.stdout, "%d relay(s): median %.0f events/s over %d rounds (%.0f–%.0f)\n", n, medians[n], len(rates), rates[0], rates[len(rates)-1])
	}
	if len(counts) > 1 {
		fmt.Fprintf(env.stdout, "ratio %d:%d relays = %.2f\n", counts[len(counts)-1], counts[0], medians[counts[len(counts)-1]]/medians[counts[0]])
	}
	dups := acks.duplicates()
	fmt.Fprintf(env.stdout, "duplicates: %d events acknowledged more than once, of %d\n", dups, len(acks.acked))
	if *asJSON {
		b, _ := json.Marshal(map[string]any{"rounds": res.Rounds, "median_events_per_s": medians, "duplicates": dups})
		fmt.Fprintln(env.stdout, string(b))
	}
	return nil
}

// ackCounter counts the acknowledgements of each event its publishers
// were given, across every relay of the run: an event acknowledged twice
// was published twice.
type ackCounter struct {
	mu    sync.Mutex
	acked map[string]int
}

func (c *ackCounter) count(pub outbox.Publisher) outbox.Publisher {
	if pub == nil {
		return nil
	}
	return countingPublisher{pub, c}
}

func (c *ackCounter) duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.acked {
		n += k - 1
	}
	return n
}

type countingPublisher struct {
	outbox.Publisher
	c *ackCounter
}

func (p countingPublisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	replies, err := p.Publisher.Publish(ctx, msgs)
	if err != nil {
		return replies, err
	}
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	for i, r := range replies {
		if r.OK() && i < len(msgs) {
			p.c.acked[msgs[i].EventID]++
		}
	}
	return replies, nil
}
