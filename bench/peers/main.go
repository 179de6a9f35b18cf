// Command peers measures, in one sitting and taking turns, how fast
// postbox ingests durably against the peers a user might pick instead:
//
//   - postbox: `postbox bench --devices D --events N --json` (its own
//     loader, devices on WebSockets, a server on a fresh SQLite file, WAL,
//     synchronous FULL, every event acknowledged after its commit is on
//     the disk), and `postbox bench --raw` (the storage engine's ceiling:
//     the same rows in plain group commits, no server);
//   - JetStream: async publish to a fresh stream of the local nats-server,
//     file (or memory) storage with the server's default sync (the data
//     reaches the disk on the server's sync interval: not durable when
//     acknowledged), a bounded number of publishes pending;
//   - Watermill: watermill-sql's Publisher on a SQLite *sql.DB with the
//     same file settings as postbox (WAL, synchronous FULL), one message
//     per Publish call and -batch messages per call.
//
// Every side sends the same number of events with the same payload from
// the same number of producers. The table shows events/s per round and
// side, and the median ratio of postbox to each other side.
//
// It is a module of its own so that postbox's go.mod and `go test ./...`
// carry none of Watermill's dependencies.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, as postbox's
)

// The sides, in the order of the table.
const (
	sidePostbox = "postbox"
	sideRaw     = "postbox-raw"
	sideJS      = "jetstream"
	sideWM1     = "watermill-1"
	sideWMBatch = "watermill-batch"
)

type config struct {
	postbox         string
	events, devices int
	wm1Events       int
	payload, batch  int
	window          int
	rounds          int
	nats, jsStorage string
	jsPending       int
	sides           []string
	dir             string
	timeout         time.Duration
}

func main() {
	var cfg config
	var sides string
	flag.StringVar(&cfg.postbox, "postbox", "", "postbox binary; empty: built from this checkout (CGO_ENABLED=0 go build ../../cmd/postbox)")
	flag.IntVar(&cfg.events, "events", 200_000, "events per run")
	flag.IntVar(&cfg.wm1Events, "events-1", 20_000, "events per run of "+sideWM1+" (about 1,000 a second: one commit each)")
	flag.IntVar(&cfg.devices, "devices", 50, "producers (postbox devices, JetStream and Watermill publishers)")
	flag.IntVar(&cfg.payload, "payload", 300, "approximate bytes of each event's JSON payload (postbox bench --payload-bytes)")
	flag.IntVar(&cfg.batch, "batch", 100, "messages per Publish call of "+sideWMBatch)
	flag.IntVar(&cfg.window, "window", 128, "most unacknowledged events per JetStream producer (postbox bench's --window)")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each runs every side, the order rotating")
	flag.StringVar(&cfg.nats, "nats", "nats://127.0.0.1:4222", "NATS server URL")
	flag.StringVar(&cfg.jsStorage, "js-storage", "file", "JetStream stream storage: file or memory")
	flag.IntVar(&cfg.jsPending, "js-pending", 4000, "most JetStream async publishes pending over all producers")
	flag.StringVar(&sides, "sides", strings.Join([]string{sidePostbox, sideRaw, sideJS, sideWM1, sideWMBatch}, ","), "sides to run, comma-separated")
	flag.StringVar(&cfg.dir, "dir", "", "directory for the Watermill SQLite files (empty: a temporary directory, which postbox bench also uses)")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "give up on a run after this long")
	flag.Parse()
	cfg.sides = strings.Split(sides, ",")
	for _, s := range cfg.sides {
		if !slices.Contains([]string{sidePostbox, sideRaw, sideJS, sideWM1, sideWMBatch}, s) {
			fmt.Fprintf(os.Stderr, "peers: unknown side %q\n", s)
			os.Exit(2)
		}
	}
	if cfg.events <= 0 || cfg.wm1Events <= 0 || cfg.devices <= 0 || cfg.batch <= 0 || cfg.rounds <= 0 || cfg.window <= 0 || cfg.jsPending <= 0 ||
		(cfg.jsStorage != "file" && cfg.jsStorage != "memory") {
		fmt.Fprintln(os.Stderr, "peers: -events, -events-1, -devices, -batch, -rounds, -window and -js-pending must be positive, -js-storage file or memory")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	tmp, err := os.MkdirTemp(cfg.dir, "postbox-peers-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if cfg.postbox == "" && (slices.Contains(cfg.sides, sidePostbox) || slices.Contains(cfg.sides, sideRaw)) {
		cfg.postbox = filepath.Join(tmp, "postbox")
		build := exec.CommandContext(ctx, "go", "build", "-o", cfg.postbox, "../../cmd/postbox")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build postbox: %w", err)
		}
	}
	rates := map[string][]float64{}
	loads := []string{}
	for round := range cfg.rounds {
		order := slices.Clone(cfg.sides)
		k := round % len(order)
		order = append(order[k:], order[:k]...) // each side goes first in turn
		for _, side := range order {
			rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
			rate, err := runSide(rctx, cfg, side, tmp, round)
			cancel()
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, side, err)
			}
			fmt.Fprintf(os.Stderr, "peers: round %d %-16s %9.0f events/s  (load %s)\n", round+1, side, rate, loadavg())
			rates[side] = append(rates[side], rate)
		}
		loads = append(loads, loadavg())
	}
	report(out, cfg, rates, loads)
	return nil
}

func runSide(ctx context.Context, cfg config, side, tmp string, round int) (float64, error) {
	switch side {
	case sidePostbox:
		return runPostbox(ctx, cfg, false)
	case sideRaw:
		return runPostbox(ctx, cfg, true)
	case sideJS:
		return runJetStream(ctx, cfg, round)
	case sideWM1:
		c := cfg
		c.events = cfg.wm1Events
		return runWatermill(ctx, c, filepath.Join(tmp, fmt.Sprintf("wm1-%d.db", round)), 1)
	default:
		return runWatermill(ctx, cfg, filepath.Join(tmp, fmt.Sprintf("wmb-%d.db", round)), cfg.batch)
	}
}

// runPostbox runs postbox bench (or its --raw ceiling) and returns its
// events_per_s; the bench itself checks every event was stored once.
func runPostbox(ctx context.Context, cfg config, raw bool) (float64, error) {
	args := []string{"bench", "--devices", strconv.Itoa(cfg.devices), "--events", strconv.Itoa(cfg.events),
		"--payload-bytes", strconv.Itoa(cfg.payload), "--json"}
	if raw {
		args = append(args, "--raw")
	}
	cmd := exec.CommandContext(ctx, cfg.postbox, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w\n%s", cfg.postbox, strings.Join(args, " "), err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var res struct {
		EventsPerS float64 `json:"events_per_s"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		return 0, fmt.Errorf("postbox bench output: %w", err)
	}
	return res.EventsPerS, nil
}

// event is what every side sends: an id, its producer, and the payload.
func payload(size int) []byte {
	base := `{"intent":"server.log_summary","confidence":0.84,"user_text":"` // as postbox bench's
	return []byte(base + strings.Repeat("x", max(size-len(base)-2, 0)) + `"}`)
}

// shares splits n events among producers.
func shares(n, producers int) []int {
	out := make([]int, producers)
	for i := range out {
		out[i] = n / producers
		if i < n%producers {
			out[i]++
		}
	}
	return out
}

// runJetStream publishes the events with JetStream async publish to a
// fresh stream, from one producer per device, each event on a subject of
// its own (as postbox's JetStream backend and its raw baseline do), each
// producer keeping at most cfg.window unacknowledged, at most
// cfg.jsPending pending over all; the clock stops at the last ack.
func runJetStream(ctx context.Context, cfg config, round int) (float64, error) {
	nc, err := nats.Connect(cfg.nats)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.jsPending))
	if err != nil {
		return 0, err
	}
	name := fmt.Sprintf("PEERS_%d_%d", time.Now().UnixNano(), round)
	storage := jetstream.FileStorage
	if cfg.jsStorage == "memory" {
		storage = jetstream.MemoryStorage
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: storage}); err != nil {
		return 0, err
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), name)
	body := payload(cfg.payload)
	var acked atomic.Int64
	errs := make(chan error, cfg.devices)
	var wg sync.WaitGroup
	start := time.Now()
	for d, n := range shares(cfg.events, cfg.devices) {
		wg.Go(func() {
			if err := jsProducer(ctx, js, name, d, n, cfg.window, body, &acked); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := errors.Join(slices.Collect(chanSeq(errs))...); err != nil {
		return 0, err
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs != uint64(cfg.events) || acked.Load() != int64(cfg.events) {
		return 0, fmt.Errorf("jetstream: %d acked, %d stored, want %d", acked.Load(), info.State.Msgs, cfg.events)
	}
	return float64(cfg.events) / took.Seconds(), nil
}

func chanSeq(c chan error) func(func(error) bool) {
	return func(yield func(error) bool) {
		for err := range c {
			if !yield(err) {
				return
			}
		}
	}
}

func jsProducer(ctx context.Context, js jetstream.JetStream, name string, device, n, window int, body []byte, acked *atomic.Int64) error {
	pending := make(chan jetstream.PubAckFuture, window)
	done := make(chan error, 1)
	go func() { // collects acks in order
		var err error
		for f := range pending {
			select {
			case <-f.Ok():
				acked.Add(1)
			case e := <-f.Err():
				err = cmpErr(err, e)
			case <-ctx.Done():
				err = cmpErr(err, ctx.Err())
			}
		}
		done <- err
	}()
	var err error
	for i := range n {
		id := fmt.Sprintf("evt_peer_%d_%d", device, i)
		sum := sha256.Sum256([]byte(id))
		msg := &nats.Msg{Subject: name + "." + hex.EncodeToString(sum[:16]), Data: body}
		var f jetstream.PubAckFuture
		for {
			f, err = js.PublishMsgAsync(msg)
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && ctx.Err() == nil {
				continue
			}
			break
		}
		if err != nil {
			break
		}
		pending <- f // blocks while window publishes are unacknowledged
	}
	close(pending)
	return errors.Join(err, <-done)
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// runWatermill publishes the events with watermill-sql's Publisher on a
// fresh SQLite file (WAL, synchronous FULL, as postbox's), perCall
// messages per Publish call, from cfg.devices producers sharing one
// *sql.DB of one connection (SQLite has one writer; more connections
// would only wait on its lock).
func runWatermill(ctx context.Context, cfg config, path string, perCall int) (float64, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	logger := watermill.NopLogger{}
	const topic = "events"
	// The schema is made before the clock starts, by the adapter's queries.
	init, err := SQLiteSchema{}.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return 0, err
	}
	for _, q := range init {
		if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return 0, err
		}
	}
	pub, err := wmsql.NewPublisher(wmsql.BeginnerFromStdSQL(db), wmsql.PublisherConfig{SchemaAdapter: SQLiteSchema{}}, logger)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	body := payload(cfg.payload)
	errs := make(chan error, cfg.devices)
	var wg sync.WaitGroup
	start := time.Now()
	for d, n := range shares(cfg.events, cfg.devices) {
		wg.Go(func() {
			metadata := message.Metadata{"device_id": "dev_" + strconv.Itoa(d), "session_id": "sess_bench", "type": "proposal.task"}
			for sent := 0; sent < n; sent += perCall {
				msgs := make([]*message.Message, min(perCall, n-sent))
				for i := range msgs {
					msgs[i] = message.NewMessage(watermill.NewUUID(), body)
					msgs[i].Metadata = metadata
				}
				if err := pub.Publish(topic, msgs...); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := errors.Join(slices.Collect(chanSeq(errs))...); err != nil {
		return 0, err
	}
	var stored int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+(SQLiteSchema{}).MessagesTable(topic)).Scan(&stored); err != nil {
		return 0, err
	}
	if stored != cfg.events {
		return 0, fmt.Errorf("watermill: %d stored, want %d", stored, cfg.events)
	}
	return float64(cfg.events) / took.Seconds(), nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report prints events/s per round and side, postbox's ratio to each
// other side within each round, and the medians.
func report(out io.Writer, cfg config, rates map[string][]float64, loads []string) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "round\t")
	for _, s := range cfg.sides {
		fmt.Fprintf(tw, "%s\t", s)
	}
	pb := rates[sidePostbox]
	var others []string
	for _, s := range cfg.sides {
		if s != sidePostbox && pb != nil {
			others = append(others, s)
			fmt.Fprintf(tw, "postbox/%s\t", s)
		}
	}
	fmt.Fprintln(tw, "load\t")
	ratios := map[string][]float64{}
	for r := range cfg.rounds {
		fmt.Fprintf(tw, "%d\t", r+1)
		for _, s := range cfg.sides {
			fmt.Fprintf(tw, "%.0f\t", rates[s][r])
		}
		for _, s := range others {
			ratio := pb[r] / rates[s][r]
			ratios[s] = append(ratios[s], ratio)
			fmt.Fprintf(tw, "%.2f\t", ratio)
		}
		fmt.Fprintf(tw, "%s\t\n", loads[r])
	}
	fmt.Fprint(tw, "median\t")
	for _, s := range cfg.sides {
		fmt.Fprintf(tw, "%.0f\t", median(rates[s]))
	}
	for _, s := range others {
		fmt.Fprintf(tw, "%.2f\t", median(ratios[s]))
	}
	fmt.Fprintln(tw, "\t")
	tw.Flush()
}
