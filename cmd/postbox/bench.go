package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
)

// benchResult is what bench --json prints as its last line.
type benchResult struct {
	Devices      int     `json:"devices"`
	Events       int     `json:"events"`
	Acked        int64   `json:"acked"`
	Nacked       int64   `json:"nacked"`
	Stored       int64   `json:"stored"` // distinct bench events found in the store; -1 when not checked
	Duplicates   int64   `json:"duplicates_stored"`
	DurationS    float64 `json:"duration_s"`
	EventsPerS   float64 `json:"events_per_s"`
	AckP50Ms     float64 `json:"ack_p50_ms"`
	AckP99Ms     float64 `json:"ack_p99_ms"`
	AckMaxMs     float64 `json:"ack_max_ms"`
	MaxBatch     int     `json:"max_batch"`
	Synchronous  string  `json:"synchronous"`
	PayloadBytes int     `json:"payload_bytes"`
	FrameEvents  int     `json:"frame_events"`
	Window       int     `json:"window"`
	Rate         float64 `json:"offered_rate"`
	PeakRSSMB    float64 `json:"peak_rss_mb"` // of this process (server and loader when in-process)
	// Server is in-process, the --server URL, or raw-jetstream for the
	// --raw baseline (no postbox server at all).
	Server string `json:"server"`
	// Streams is the started server's stream backend (sqlite or nats);
	// empty with --server.
	Streams string `json:"streams,omitempty"`
	// The started server's writer during the load, from its /metrics:
	// group commits (on a backend other than SQLite, appendq batches),
	// events per commit, and the share of the time it spent committing.
	WriterCommits   int64   `json:"writer_commits,omitempty"`
	WriterMeanBatch float64 `json:"writer_mean_batch,omitempty"`
	WriterBusy      float64 `json:"writer_busy,omitempty"`
}

// measured records a load that began at start: its duration, what was
// acked and nacked, the rate, ACK latencies and peak memory.
func (res *benchResult) measured(start time.Time, acked, nacked *atomic.Int64, lat *latencies) {
	res.DurationS = since(start)
	res.Acked, res.Nacked = acked.Load(), nacked.Load()
	res.EventsPerS = float64(res.Acked) / res.DurationS
	res.AckP50Ms, res.AckP99Ms, res.AckMaxMs = lat.quantile(0.50), lat.quantile(0.99), lat.quantile(1)
	res.PeakRSSMB = peakRSSMB()
}

func runBench(ctx context.Context, env *cmdEnv, args []string) error {
	if len(args) > 0 && args[0] == "webhooks" {
		return runBenchWebhooks(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "relay" {
		return runBenchRelay(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "delivery" {
		return runBenchDelivery(ctx, env, args[1:])
	}
	fs := newFlags(env, "bench", "[flags]", `Plays N devices, each on its own WebSocket connection, sending events with pipelining
(many frames in flight) to a server it starts itself on a temporary database (or to --server),
then checks the store holds every event exactly once. Progress goes to stderr; --json prints
one JSON object as the last line of stdout.

With --streams nats://host:4222 the started server keeps its streams in NATS JetStream, under
a prefix of the run's own (BENCH_<run>_, unless the URL sets prefix=) whose streams and
consumer bucket are deleted at the end; the store check then reads the stream back through
the backend. --raw, with a nats:// --streams, publishes the same events straight to a fresh
stream made as postbox makes them (JetStream async publish, no server, no WebSocket): the
baseline postbox on JetStream is measured against.

postbox bench webhooks measures POST /webhooks instead (postbox bench webhooks --help),
postbox bench relay a transactional outbox relay (postbox bench relay --help), and postbox
bench delivery the workers delivering items to a target (postbox bench delivery --help).`)
	devices := positiveInt(50)
	fs.Var(&devices, "devices", "`devices` (connections)")
	events := positiveInt(200000)
	fs.Var(&events, "events", "`events` in all, shared among the devices")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "the started server's most `events` per group commit (1 = a transaction per event)")
	frame := positiveInt(64)
	fs.Var(&frame, "frame", "`envelopes` per frame")
	window := positiveInt(128)
	fs.Var(&window, "window", "most unacknowledged `envelopes` per device")
	payloadBytes := positiveInt(300)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each payload in `bytes`")
	rate := fs.Float64("rate", 0, "offered events/s over all devices (0 = as fast as acks allow)")
	srvURL := fs.String("server", "", "a running server (ws://host:port) instead of starting one")
	dbPath := fs.String("db", "", "with --server: its database file, to check what was stored")
	sync := fs.String("synchronous", "FULL", "the started server's SQLite synchronous mode")
	token := fs.String("token", "", "bearer token for --server")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run (server and loader) to this file")
	streams := fs.String("streams", "sqlite", "the started server's stream `backend`: sqlite (its temporary database) or nats://host:4222[?replicas=3&prefix=NAME]")
	queueSize := positiveInt(groupcommit.DefaultQueueSize)
	fs.Var(&queueSize, "queue-size", "the started server's writer queue bound in `events`")
	raw := fs.Bool("raw", false, "with --streams nats://…: publish the events straight to JetStream (the baseline), without a postbox server")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	kind, err := streamsKind(*streams)
	if err != nil {
		return err
	}
	if *srvURL != "" && (isSet(fs, "streams") || *raw) {
		return usagef("--streams and --raw are for the server bench starts, not with --server")
	}
	if *raw && kind != "nats" {
		return usagef("--raw publishes to JetStream: give --streams nats://host:4222")
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var bn *benchNATS
	if kind == "nats" {
		if bn, err = newBenchNATS(*streams, run); err != nil {
			return err
		}
		defer func() {
			if err := bn.drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(env.stderr, "bench: %v\n", err)
			}
		}()
	}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	res := benchResult{Devices: int(devices), Events: int(events), MaxBatch: int(maxBatch), Synchronous: strings.ToUpper(*sync),
		PayloadBytes: int(payloadBytes), FrameEvents: int(frame), Window: int(window), Rate: *rate, Stored: -1, Streams: kind}
	prefix := "evt_bench_" + run + "_"
	if *raw {
		if *rate > 0 {
			return usagef("--raw publishes as fast as acks allow: leave out --rate")
		}
		res.Server, res.MaxBatch, res.Synchronous = "raw-jetstream", 0, ""
		err := runRawJetStream(ctx, env, bn, rawBench{devices: int(devices), events: int(events), frame: int(frame), window: int(window),
			payload: benchPayload(int(payloadBytes)), idPrefix: prefix}, &res)
		if err != nil {
			return err
		}
		return benchReport(env, &res, *asJSON)
	}

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srv *server.Server
	if *srvURL == "" {
		var addr string
		var cleanup func()
		var err error
		spec := *streams
		if bn != nil {
			spec = bn.spec
		}
		srv, addr, cleanup, err = startBenchServerOn(srvCtx, g, stopSrv,
			server.Config{MaxBatch: int(maxBatch), QueueSize: int(queueSize), Synchronous: res.Synchronous}, spec, "sqlite")
		if err != nil {
			return err
		}
		defer cleanup()
		*srvURL = "ws://" + addr
		res.Server = "in-process"
	} else {
		res.Server = *srvURL
		res.MaxBatch, res.Synchronous, res.Streams = 0, "", ""
	}

	metricsURL := ""
	if srv != nil {
		metricsURL = "http" + strings.TrimPrefix(*srvURL, "ws") + "/metrics"
	}
	var before writerStats
	if metricsURL != "" {
		before, _ = scrapeWriter(gctx, metricsURL)
	}
	var acked, nacked atomic.Int64
	lat := &latencies{}
	start := time.Now()
	progressDone := make(chan struct{})
	go benchProgress(env, &acked, int64(events), start, progressDone)
	load, lctx := errgroup.WithContext(gctx)
	payload := benchPayload(int(payloadBytes))
	for d := 0; d < int(devices); d++ {
		n := int(events) / int(devices)
		if d < int(events)%int(devices) {
			n++
		}
		perDevice := 0.0
		if *rate > 0 {
			perDevice = *rate / float64(devices)
		}
		load.Go(func() error {
			// Devices start their paced schedules at evenly spread phases, so
			// the offered load is smooth rather than one burst per interval.
			phase := time.Duration(0)
			if perDevice > 0 {
				phase = time.Duration(float64(d) / float64(devices) * float64(frame) / perDevice * float64(time.Second))
			}
			return benchDevice(lctx, *srvURL, *token, prefix, fmt.Sprintf("bench-%03d", d), n,
				int(frame), int(window), perDevice, phase, payload, &acked, &nacked, lat)
		})
	}
	err = load.Wait()
	close(progressDone)
	res.measured(start, &acked, &nacked, lat)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if metricsURL != "" {
		if after, err := scrapeWriter(gctx, metricsURL); err == nil && after.commits > before.commits {
			res.WriterCommits = int64(after.commits - before.commits)
			res.WriterMeanBatch = (after.entries - before.entries) / float64(res.WriterCommits)
			res.WriterBusy = (after.seconds - before.seconds) / res.DurationS
		}
	}

	res.Stored, res.Duplicates, err = checkStored(ctx, srv, *dbPath, server.DeviceSource, prefix)
	if err != nil {
		return fmt.Errorf("bench: check store: %w", err)
	}
	stopSrv()
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return err
	}
	return benchReport(env, &res, *asJSON)
}

// benchReport prints res (as JSON on the last line of stdout with asJSON)
// and fails unless every event was acked and stored exactly once.
func benchReport(env *cmdEnv, res *benchResult, asJSON bool) error {
	fmt.Fprintf(env.stderr, "bench: %d events acked in %.2fs: %.0f events/s, ack p50 %.2f ms, p99 %.2f ms, stored %d (%d duplicates), peak RSS %.0f MB\n",
		res.Acked, res.DurationS, res.EventsPerS, res.AckP50Ms, res.AckP99Ms, res.Stored, res.Duplicates, res.PeakRSSMB)
	if asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(env.stdout, string(b))
	}
	if res.Acked != int64(res.Events) || (res.Stored >= 0 && (res.Stored != int64(res.Events) || res.Duplicates != 0)) {
		return fmt.Errorf("bench: %d events sent, %d acked, %d nacked, %d stored, %d stored twice", res.Events, res.Acked, res.Nacked, res.Stored, res.Duplicates)
	}
	return nil
}

// startBenchServer runs a server for cfg on a temporary database on a
// loopback port in g until ctx ends, and returns it with its address and
// a cleanup to defer: it stops the server (stop cancels ctx), waits for it
// and then removes its directory.
func startBenchServer(ctx context.Context, g *errgroup.Group, stop context.CancelFunc, cfg server.Config) (*server.Server, string, func(), error) {
	return startBenchServerOn(ctx, g, stop, cfg, "sqlite", "sqlite")
}

// startBenchServerOn is startBenchServer on the stream backend streams
// and the delivery store store name (--streams and --store values),
// opened as serve opens them; the temporary database holds what neither
// holds.
func startBenchServerOn(ctx context.Context, g *errgroup.Group, stop context.CancelFunc, cfg server.Config, streams, store string) (*server.Server, string, func(), error) {
	dir, err := os.MkdirTemp("", "postbox-bench-*")
	if err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	cfg.Listener, cfg.DBPath = ln, filepath.Join(dir, "postbox.db")
	closeBackends, err := openBackends(&cfg, streams, store, slog.New(slog.DiscardHandler))
	if err != nil {
		ln.Close()
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	srv, err := server.New(cfg)
	if err != nil {
		closeBackends()
		ln.Close()
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	g.Go(func() error { return srv.Run(ctx) })
	return srv, ln.Addr().String(), func() {
		stop()
		g.Wait()
		os.RemoveAll(dir)
	}, nil
}

// startCPUProfile writes a CPU profile to path until the function it
// returns is called; with no path it does nothing.
func startCPUProfile(path string) (stop func(), _ error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// checkStored counts the run's events (ids starting with prefix) in the
// stream of source: in the started server's SQLite streams, or through
// its other stream backend, else in the database file dbPath; -1 stored
// when there is neither.
func checkStored(ctx context.Context, srv *server.Server, dbPath, source, prefix string) (stored, dups int64, err error) {
	var sqlite interface{ ReadDB() *sql.DB }
	if srv != nil {
		sqlite, _ = srv.Streams().(interface{ ReadDB() *sql.DB })
	}
	switch {
	case srv != nil && sqlite != nil:
		return countStored(ctx, sqlite.ReadDB().QueryRowContext, source, prefix)
	case srv != nil:
		return countThroughBackend(ctx, srv.Streams(), source, prefix)
	case srv == nil && dbPath != "":
		db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
		if err != nil {
			return 0, 0, err
		}
		defer db.Close()
		return countStored(ctx, db.QueryRowContext, source, prefix)
	}
	return -1, 0, nil
}

// countStored counts the run's events in a stream of the store: distinct
// identities and rows beyond one per identity (which the unique key
// forbids).
func countStored(ctx context.Context, q func(context.Context, string, ...any) *sql.Row, streamID, prefix string) (stored, dups int64, err error) {
	err = q(ctx, `SELECT count(*), count(*) - count(DISTINCT source_native_id) FROM stream_events
		WHERE stream_id = ? AND source_native_id >= ? AND source_native_id < ?`, streamID, prefix, prefix+"~").Scan(&stored, &dups)
	return
}

func benchPayload(size int) []byte {
	base := `{"intent":"server.log_summary","confidence":0.84,"user_text":"`
	pad := max(size-len(base)-2, 0)
	return []byte(base + strings.Repeat("x", pad) + `"}`)
}

// benchDevice sends n events in frames, keeping at most window events
// unacknowledged, optionally paced to rate events/s.
func benchDevice(ctx context.Context, url, token, idPrefix, device string, n, frame, window int, rate float64, phase time.Duration,
	payload []byte, acked, nacked *atomic.Int64, lat *latencies) error {
	conn, err := client.Dial(ctx, url, client.Options{Token: token})
	if err != nil {
		return err
	}
	defer conn.Close()
	slots := make(chan struct{}, max(window/frame, 1))
	g, gctx := errgroup.WithContext(ctx)
	ts := time.Now().UTC().Format(time.RFC3339Nano)
	start := time.Now().Add(phase)
	for sent := 0; sent < n; sent += frame {
		size := min(frame, n-sent)
		if rate > 0 {
			due := start.Add(time.Duration(float64(sent) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-gctx.Done():
					return g.Wait()
				}
			}
		}
		msgs := benchFrame(idPrefix, device, ts, payload, size)
		select {
		case slots <- struct{}{}:
		case <-gctx.Done():
			return g.Wait()
		}
		g.Go(func() error {
			defer func() { <-slots }()
			t0 := time.Now()
			replies, err := conn.Send(gctx, msgs)
			if err != nil {
				return err
			}
			lat.add(time.Since(t0), len(replies))
			for _, r := range replies {
				if r.OK() {
					acked.Add(1)
				} else {
					nacked.Add(1)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// benchFrame builds one frame of size envelopes of device, with
// time-ordered ids (as agents make them, evt_<ULID>) under idPrefix so
// that the store check can find them.
func benchFrame(idPrefix, device, ts string, payload []byte, size int) []client.Message {
	msgs := make([]client.Message, size)
	for i := range msgs {
		id := idPrefix + strings.TrimPrefix(outbox.NewEventID(), "evt_")
		env := make([]byte, 0, len(payload)+200)
		env = append(env, `{"schema_version":1,"event_id":"`...)
		env = append(env, id...)
		env = append(env, `","type":"proposal.task","ts":"`...)
		env = append(env, ts...)
		env = append(env, `","session_id":"sess_bench","device_id":"`...)
		env = append(env, device...)
		env = append(env, `","payload":`...)
		env = append(env, payload...)
		env = append(env, '}')
		msgs[i] = client.Message{EventID: id, Envelope: env}
	}
	return msgs
}

// latencies records ack latencies, one sample per frame weighted by its
// envelopes.
type latencies struct {
	mu      sync.Mutex
	samples []latSample
}

type latSample struct {
	d time.Duration
	n int
}

func (l *latencies) add(d time.Duration, n int) {
	l.mu.Lock()
	l.samples = append(l.samples, latSample{d, n})
	l.mu.Unlock()
}

// quantile returns the q-quantile in milliseconds.
func (l *latencies) quantile(q float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) == 0 {
		return 0
	}
	slices.SortFunc(l.samples, func(a, b latSample) int { return int(a.d - b.d) })
	total := 0
	for _, s := range l.samples {
		total += s.n
	}
	rank, seen := int(q*float64(total)), 0
	for _, s := range l.samples {
		seen += s.n
		if seen >= rank && seen > 0 {
			return float64(s.d.Microseconds()) / 1000
		}
	}
	return float64(l.samples[len(l.samples)-1].d.Microseconds()) / 1000
}

func benchProgress(env *cmdEnv, acked *atomic.Int64, total int64, start time.Time, done chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastT := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := acked.Load()
			fmt.Fprintf(env.stderr, "bench: %d/%d acked, %.0f events/s now\n", n, total, float64(n-last)/now.Sub(lastT).Seconds())
			last, lastT = n, now
		}
	}
}

// peakRSSMB returns this process's peak resident set size.
func peakRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
