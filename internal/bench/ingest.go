package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

// IngestConfig is a run of Ingest. Counts are positive; the caller
// validates them.
type IngestConfig struct {
	Devices      int     // devices, each on its own connection
	Events       int     // events in all, shared among the devices
	Frame        int     // envelopes per frame
	Window       int     // most unacknowledged envelopes per device
	PayloadBytes int     // approximate size of each payload
	Rate         float64 // offered events/s over all devices; 0: as fast as acks allow

	// Server is a running server's ws:// or grpc:// URL, sent to with
	// Token; empty: Ingest starts one in this process through Open.
	// DBPath, with Server, is its database file, read to check what was
	// stored (empty: not checked).
	Server, Token, DBPath string

	// Transport is how devices reach the started server: TransportWebSocket
	// (the default when empty) or TransportGRPC. With Server, its URL
	// says.
	Transport string

	// The started server's writer: MaxBatch, QueueSize and SQLite
	// Synchronous mode, as server.Config has them.
	MaxBatch, QueueSize int
	Synchronous         string

	// Streams is the started server's stream backend (a --streams value:
	// sqlite, nats://… or kafka://…) and StreamsKind its kind (sqlite,
	// nats or kafka). A nats:// or kafka:// run without a prefix= gets a
	// prefix of its own, whose streams or topics it deletes at the end.
	// Kafka is the kafka:// URL parsed.
	Streams, StreamsKind string
	Kafka                streamkafka.Config

	// Raw publishes the events straight to JetStream or Kafka (with nats
	// or kafka streams) or inserts them into a fresh SQLite database in
	// plain group commits (with sqlite streams), without a postbox server:
	// the baseline.
	Raw bool

	CPUProfile string    // a file for a CPU profile of the run; empty: none
	Trace      string    // a file for an execution trace of the run; empty: none
	Open       OpenFunc  // opens the started server's backends
	Progress   io.Writer // progress lines, one a second; nil: discarded
}

// Transports of IngestConfig.Transport.
const (
	TransportWebSocket = "websocket"
	TransportGRPC      = "grpc"
)

// IngestResult is what Ingest measured; as JSON, the object bench --json
// prints.
type IngestResult struct {
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
	// Server is in-process, the --server URL, or raw-sqlite,
	// raw-jetstream or raw-kafka for the --raw baseline (no postbox
	// server at all).
	Server string `json:"server"`
	// Transport is websocket or grpc; empty for the --raw baseline.
	Transport string `json:"transport,omitempty"`
	// Streams is the started server's stream backend (sqlite, nats or kafka);
	// empty with --server.
	Streams string `json:"streams,omitempty"`
	// The started server's writer during the load, from its /metrics:
	// group commits (on a backend other than SQLite, appendq batches),
	// events per commit, and the share of the time it spent committing.
	WriterCommits   int64   `json:"writer_commits,omitempty"`
	WriterMeanBatch float64 `json:"writer_mean_batch,omitempty"`
	WriterBusy      float64 `json:"writer_busy,omitempty"`
}

// Check fails unless every event was acked and, when the store was
// checked, stored exactly once.
func (res *IngestResult) Check() error {
	if res.Acked != int64(res.Events) || (res.Stored >= 0 && (res.Stored != int64(res.Events) || res.Duplicates != 0)) {
		return fmt.Errorf("bench: %d events sent, %d acked, %d nacked, %d stored, %d stored twice", res.Events, res.Acked, res.Nacked, res.Stored, res.Duplicates)
	}
	return nil
}

// measured records a load that began at start: its duration, what was
// acked and nacked, the rate, ACK latencies and peak memory.
func (res *IngestResult) measured(start time.Time, acked, nacked *atomic.Int64, lat *latencies) {
	res.DurationS = time.Since(start).Seconds()
	res.Acked, res.Nacked = acked.Load(), nacked.Load()
	res.EventsPerS = float64(res.Acked) / res.DurationS
	res.AckP50Ms, res.AckP99Ms, res.AckMaxMs = lat.quantile(0.50), lat.quantile(0.99), lat.quantile(1)
	res.PeakRSSMB = peakRSSMB()
}

// Ingest plays cfg.Devices devices, each on its own connection (a
// WebSocket, or a gRPC stream),
// sending events with pipelining to a server it starts (or cfg.Server),
// then counts what the store holds of them. It returns an error when the
// load or the count fails; whether every event was acked and stored once
// is for the result's Check.
func Ingest(ctx context.Context, cfg IngestConfig) (*IngestResult, error) {
	progress := progressOut(cfg.Progress)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var bn *benchNATS
	var bk *benchKafka
	var err error
	spec := cfg.Streams
	switch cfg.StreamsKind {
	case "nats":
		if bn, err = newBenchNATS(cfg.Streams, run); err != nil {
			return nil, err
		}
		spec = bn.spec
		defer func() {
			if err := bn.drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(progress, "bench: %v\n", err)
			}
		}()
	case "kafka":
		bk = newBenchKafka(cfg.Streams, cfg.Kafka, run)
		spec = bk.spec
		defer func() {
			if err := bk.drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(progress, "bench: %v\n", err)
			}
		}()
	}
	stopProfile, err := startCPUProfile(cfg.CPUProfile)
	if err != nil {
		return nil, err
	}
	defer stopProfile()
	stopTrace, err := startTrace(cfg.Trace)
	if err != nil {
		return nil, err
	}
	defer stopTrace()
	res := &IngestResult{Devices: cfg.Devices, Events: cfg.Events, MaxBatch: cfg.MaxBatch, Synchronous: strings.ToUpper(cfg.Synchronous),
		PayloadBytes: cfg.PayloadBytes, FrameEvents: cfg.Frame, Window: cfg.Window, Rate: cfg.Rate, Stored: -1, Streams: cfg.StreamsKind}
	prefix := "evt_bench_" + run + "_"
	if cfg.Raw {
		if cfg.Rate > 0 {
			return nil, usagef("--raw publishes as fast as acks allow: leave out --rate")
		}
		rb := rawBench{devices: cfg.Devices, events: cfg.Events, frame: cfg.Frame, window: cfg.Window,
			payload: agentPayload(cfg.PayloadBytes), idPrefix: prefix}
		res.MaxBatch, res.Synchronous = 0, ""
		switch {
		case bk != nil:
			res.Server, err = "raw-kafka", runRawKafka(ctx, progress, bk, rb, res)
		case bn != nil:
			res.Server, err = "raw-jetstream", runRawJetStream(ctx, progress, bn, rb, res)
		default:
			res.Server, res.MaxBatch, res.Synchronous = "raw-sqlite", cfg.MaxBatch, strings.ToUpper(cmp.Or(cfg.Synchronous, "FULL"))
			err = runRawSQLite(ctx, progress, rb, cfg.MaxBatch, cfg.QueueSize, cfg.Synchronous, res)
		}
		if err != nil {
			return nil, err
		}
		return res, nil
	}

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srv *server.Server
	srvURL := cfg.Server
	metricsURL := ""
	if srvURL == "" {
		scfg := server.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize, Synchronous: res.Synchronous,
			WSMaxConnectionsPerAddress: -1} // every device connects from loopback
		res.Transport = TransportWebSocket
		if cfg.Transport == TransportGRPC {
			if scfg.GRPCListener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				return nil, err
			}
			res.Transport = TransportGRPC
		}
		var addr string
		var cleanup func()
		srv, addr, cleanup, err = startServer(srvCtx, g, stopSrv, cfg.Open, scfg, spec, "sqlite")
		if err != nil {
			if scfg.GRPCListener != nil {
				scfg.GRPCListener.Close()
			}
			return nil, err
		}
		defer cleanup()
		srvURL = "ws://" + addr
		if scfg.GRPCListener != nil {
			srvURL = "grpc://" + scfg.GRPCListener.Addr().String()
		}
		metricsURL = "http://" + addr + "/metrics"
		res.Server = "in-process"
	} else {
		res.Server = srvURL
		res.Transport = TransportWebSocket
		if strings.HasPrefix(srvURL, "grpc") {
			res.Transport = TransportGRPC
		}
		res.MaxBatch, res.Synchronous, res.Streams = 0, "", ""
	}

	var before writerStats
	if metricsURL != "" {
		before, _ = scrapeWriter(gctx, metricsURL)
	}
	var acked, nacked atomic.Int64
	lat := &latencies{}
	start := time.Now()
	progressDone := make(chan struct{})
	go ackProgress(progress, &acked, int64(cfg.Events), start, progressDone)
	load, lctx := errgroup.WithContext(gctx)
	payload := agentPayload(cfg.PayloadBytes)
	for d := 0; d < cfg.Devices; d++ {
		n := cfg.Events / cfg.Devices
		if d < cfg.Events%cfg.Devices {
			n++
		}
		perDevice := 0.0
		if cfg.Rate > 0 {
			perDevice = cfg.Rate / float64(cfg.Devices)
		}
		load.Go(func() error {
			// Devices start their paced schedules at evenly spread phases, so
			// the offered load is smooth rather than one burst per interval.
			phase := time.Duration(0)
			if perDevice > 0 {
				phase = time.Duration(float64(d) / float64(cfg.Devices) * float64(cfg.Frame) / perDevice * float64(time.Second))
			}
			return play(lctx, srvURL, cfg.Token, prefix, fmt.Sprintf("bench-%03d", d), n,
				cfg.Frame, cfg.Window, perDevice, phase, payload, &acked, &nacked, lat)
		})
	}
	err = load.Wait()
	stopTrace()
	close(progressDone)
	res.measured(start, &acked, &nacked, lat)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if metricsURL != "" {
		if after, err := scrapeWriter(gctx, metricsURL); err == nil && after.commits > before.commits {
			res.WriterCommits = int64(after.commits - before.commits)
			res.WriterMeanBatch = (after.entries - before.entries) / float64(res.WriterCommits)
			res.WriterBusy = (after.seconds - before.seconds) / res.DurationS
		}
	}

	res.Stored, res.Duplicates, err = checkStored(ctx, srv, cfg.DBPath, server.DeviceSource, prefix)
	if err != nil {
		return nil, fmt.Errorf("bench: check store: %w", err)
	}
	stopSrv()
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return nil, err
	}
	return res, nil
}

// agentPayload returns a JSON payload of about size bytes shaped like an
// agent's event.
func agentPayload(size int) []byte {
	base := `{"intent":"server.log_summary","confidence":0.84,"user_text":"`
	pad := max(size-len(base)-2, 0)
	return []byte(base + strings.Repeat("x", pad) + `"}`)
}

// play sends n events of device in frames, keeping at most window events
// unacknowledged, optionally paced to rate events/s.
func play(ctx context.Context, url, token, idPrefix, device string, n, frame, window int, rate float64, phase time.Duration,
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
		msgs := deviceFrame(idPrefix, device, ts, payload, size)
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

// deviceFrame builds one frame of size envelopes of device, with
// time-ordered ids (as agents make them, evt_<ULID>) under idPrefix so
// that the store check can find them.
func deviceFrame(idPrefix, device, ts string, payload []byte, size int) []client.Message {
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

// ackProgress prints, once a second until done closes, how many of total
// events are acked and the rate of the last second.
func ackProgress(w io.Writer, acked *atomic.Int64, total int64, start time.Time, done chan struct{}) {
	everySecond(acked, start, done, func(n int64, rate float64) {
		fmt.Fprintf(w, "bench: %d/%d acked, %.0f events/s now\n", n, total, rate)
	})
}

// everySecond calls line, once a second until done closes, with count's
// value and its rate over the last second (the first from start).
func everySecond(count *atomic.Int64, start time.Time, done chan struct{}, line func(n int64, rate float64)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastT := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := count.Load()
			line(n, float64(n-last)/now.Sub(lastT).Seconds())
			last, lastT = n, now
		}
	}
}
