package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/outbox"
)

// AgentConfig is a run of Agent. Counts are positive; the caller
// validates them.
type AgentConfig struct {
	Events       int // events per run of each path
	Rounds       int // rounds; each runs the agent path and direct ingest, in alternating order
	PayloadBytes int // approximate size of each payload

	// The agent path: Chunk events per POST to the intake (postbox send
	// posts 1,000), Senders POSTs in flight at once (send keeps
	// postbox send's --parallel), and the agent's relay: Batch events per
	// frame and a window growing up to Window (0: the agent's defaults).
	Chunk, Senders, Batch, Window int

	// Direct ingest: Devices connections, as postbox bench plays them
	// (frames of 64, windows of 128).
	Devices int

	// The server's writer (MaxBatch, QueueSize: server.Config's) and the
	// SQLite synchronous mode of both the server and the agent's outbox.
	MaxBatch, QueueSize int
	Synchronous         string

	// SkipDirect runs the agent path alone.
	SkipDirect bool

	CPUProfile string    // a file for a CPU profile of the agent path's runs; empty: none
	Open       OpenFunc  // opens the started servers' backends
	Progress   io.Writer // progress lines; nil: discarded
}

// AgentRun is one timed run of the agent path.
type AgentRun struct {
	// IntakeS is the time until the intake answered every POST (every
	// event committed in the agent's outbox); IntakeEventsPerS its rate.
	IntakeS          float64 `json:"intake_s"`
	IntakeEventsPerS float64 `json:"intake_events_per_s"`
	// DurationS is the time until every event was ACKed by the server
	// and deleted from the agent's outbox; EventsPerS the rate end to end.
	DurationS  float64 `json:"duration_s"`
	EventsPerS float64 `json:"events_per_s"`
	Stored     int64   `json:"stored"`            // distinct run events in the server's store
	Duplicates int64   `json:"duplicates_stored"` // rows beyond one per event
	Pending    int64   `json:"outbox_pending"`    // rows left in the agent's outbox
	Rejected   int64   `json:"outbox_rejected"`
}

// AgentResult is what Agent measured; as JSON, the object bench agent
// --json prints.
type AgentResult struct {
	Events       int        `json:"events"`
	PayloadBytes int        `json:"payload_bytes"`
	Synchronous  string     `json:"synchronous"`
	Chunk        int        `json:"chunk"`
	Senders      int        `json:"senders"`
	Devices      int        `json:"devices"`
	Components   string     `json:"components"` // in-process: the server, the agent and the loader share this process
	Agent        []AgentRun `json:"agent"`
	Direct       []float64  `json:"direct_events_per_s,omitempty"`
	// The medians of the rounds, and AgentEventsPerS / DirectEventsPerS.
	AgentEventsPerS  float64 `json:"agent_events_per_s"`
	IntakeEventsPerS float64 `json:"intake_events_per_s"`
	DirectEventsPerS float64 `json:"direct_events_per_s_median,omitempty"`
	Ratio            float64 `json:"ratio,omitempty"`
}

// Check fails unless every run of the agent path stored every event
// exactly once and left the outbox empty.
func (res *AgentResult) Check() error {
	for i, r := range res.Agent {
		if r.Stored != int64(res.Events) || r.Duplicates != 0 || r.Pending != 0 || r.Rejected != 0 {
			return fmt.Errorf("bench agent: round %d: %d events sent, %d stored, %d stored twice, %d pending and %d rejected in the outbox",
				i+1, res.Events, r.Stored, r.Duplicates, r.Pending, r.Rejected)
		}
	}
	return nil
}

// Agent measures the agent path end to end (events POSTed to an agent's
// intake as postbox send posts them, committed in its SQLite outbox,
// relayed over a WebSocket to a server storing them in its own SQLite
// file) against direct ingest of as many events into a server, in
// cfg.Rounds rounds of alternating order. The servers and the agent run
// in this process, each on a fresh file in a temporary directory.
func Agent(ctx context.Context, cfg AgentConfig) (*AgentResult, error) {
	progress := progressOut(cfg.Progress)
	mode := strings.ToUpper(cfg.Synchronous)
	if mode == "" {
		mode = "FULL"
	}
	res := &AgentResult{Events: cfg.Events, PayloadBytes: cfg.PayloadBytes, Synchronous: mode, Chunk: cfg.Chunk, Senders: cfg.Senders,
		Devices: cfg.Devices, Components: "in-process"}
	stopProfile := func() {}
	profiling := false
	for round := range cfg.Rounds {
		agentFirst := round%2 == 0
		for step := range 2 {
			if (step == 0) == agentFirst {
				if cfg.CPUProfile != "" && !profiling {
					var err error
					if stopProfile, err = startCPUProfile(cfg.CPUProfile); err != nil {
						return nil, err
					}
					profiling = true
				}
				r, err := agentPath(ctx, cfg, mode, progress)
				stopProfile()
				stopProfile = func() {}
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(progress, "bench agent: round %d: agent path %d events in %.2fs: %.0f events/s end to end (intake %.0f events/s)\n",
					round+1, cfg.Events, r.DurationS, r.EventsPerS, r.IntakeEventsPerS)
				res.Agent = append(res.Agent, *r)
				continue
			}
			if cfg.SkipDirect {
				continue
			}
			d, err := Ingest(ctx, IngestConfig{
				Devices: cfg.Devices, Events: cfg.Events, Frame: 64, Window: 128, PayloadBytes: cfg.PayloadBytes,
				MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize, Synchronous: mode, Streams: "sqlite", StreamsKind: "sqlite",
				Open: cfg.Open,
			})
			if err != nil {
				return nil, err
			}
			if err := d.Check(); err != nil {
				return nil, err
			}
			fmt.Fprintf(progress, "bench agent: round %d: direct %d events in %.2fs: %.0f events/s\n", round+1, cfg.Events, d.DurationS, d.EventsPerS)
			res.Direct = append(res.Direct, d.EventsPerS)
		}
	}
	var e2e, intake []float64
	for _, r := range res.Agent {
		e2e, intake = append(e2e, r.EventsPerS), append(intake, r.IntakeEventsPerS)
	}
	res.AgentEventsPerS, res.IntakeEventsPerS = median(e2e), median(intake)
	if len(res.Direct) > 0 {
		res.DirectEventsPerS = median(res.Direct)
		res.Ratio = res.AgentEventsPerS / res.DirectEventsPerS
	}
	return res, nil
}

// median returns the median of xs (the mean of the middle two for an
// even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// agentPath runs one timed run of the agent path: a fresh server and a
// fresh agent, the events posted to the intake, timed until the relay
// settled (deleted from the outbox) every one of them.
func agentPath(ctx context.Context, cfg AgentConfig, mode string, progress io.Writer) (*AgentRun, error) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "evt_bench_" + run + "_"
	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	srv, addr, cleanup, err := startServer(srvCtx, g, stopSrv, cfg.Open, server.Config{MaxBatch: cfg.MaxBatch, QueueSize: cfg.QueueSize, Synchronous: mode}, "sqlite", "sqlite")
	if err != nil {
		return nil, err
	}
	defer cleanup()

	dir, err := os.MkdirTemp("", "postbox-bench-agent-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var delivered atomic.Int64
	allDelivered := make(chan struct{})
	var once sync.Once
	a, err := agent.New(agent.Config{
		Server: "ws://" + addr, OutboxPath: filepath.Join(dir, "outbox.db"), DeviceID: "bench-agent", Synchronous: mode,
		AckTimeout: 30 * time.Second, Listener: ln,
		Relay: outbox.RelayConfig{BatchSize: cfg.Batch, MaxInFlight: cfg.Window, Observe: func(st outbox.Stats) {
			if delivered.Add(int64(st.Delivered)) >= int64(cfg.Events) {
				once.Do(func() { close(allDelivered) })
			}
		}},
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	agentCtx, stopAgent := context.WithCancel(gctx)
	defer stopAgent()
	agentDone := make(chan error, 1)
	go func() { agentDone <- a.Run(agentCtx) }()
	defer func() {
		stopAgent()
		<-agentDone
	}()
	intakeURL := "http://" + ln.Addr().String() + "/v1/events"
	if err := waitReady(ctx, "http://"+ln.Addr().String()+"/health"); err != nil {
		return nil, err
	}

	// The requests are built before the clock starts: postbox send
	// builds them in a process of its own.
	payload := agentPayload(cfg.PayloadBytes)
	var bodies [][]byte
	var sizes []int
	for sent := 0; sent < cfg.Events; sent += cfg.Chunk {
		n := min(cfg.Chunk, cfg.Events-sent)
		envs := make([]postbox.Envelope, n)
		for i := range envs {
			envs[i] = postbox.Envelope{EventID: prefix + strings.TrimPrefix(outbox.NewEventID(), "evt_"), Type: "proposal.task", Payload: payload}
		}
		body, err := json.Marshal(envs) // as postbox send builds its requests
		if err != nil {
			return nil, err
		}
		bodies, sizes = append(bodies, body), append(sizes, n)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Senders}}
	defer hc.CloseIdleConnections()
	var queued atomic.Int64
	start := time.Now()
	progressDone := make(chan struct{})
	go agentProgress(progress, &queued, &delivered, int64(cfg.Events), start, progressDone)
	defer close(progressDone)
	load, lctx := errgroup.WithContext(gctx)
	load.SetLimit(cfg.Senders)
	for i, body := range bodies {
		load.Go(func() error {
			if err := postIntake(lctx, hc, intakeURL, body); err != nil {
				return err
			}
			queued.Add(int64(sizes[i]))
			return nil
		})
	}
	if err := load.Wait(); err != nil {
		return nil, fmt.Errorf("bench agent: %w", err)
	}
	r := &AgentRun{IntakeS: time.Since(start).Seconds()}
	select {
	case <-allDelivered:
	case err := <-agentDone:
		agentDone <- err
		return nil, fmt.Errorf("bench agent: the agent stopped with %d of %d events delivered: %v", delivered.Load(), cfg.Events, err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.DurationS = time.Since(start).Seconds()
	r.IntakeEventsPerS = float64(cfg.Events) / r.IntakeS
	r.EventsPerS = float64(cfg.Events) / r.DurationS
	if r.Pending, r.Rejected, err = a.Store().Counts(ctx); err != nil {
		return nil, fmt.Errorf("bench agent: outbox counts: %w", err)
	}
	if r.Stored, r.Duplicates, err = checkStored(ctx, srv, "", server.DeviceSource, prefix); err != nil {
		return nil, fmt.Errorf("bench agent: check store: %w", err)
	}
	stopAgent()
	if err := <-agentDone; err != nil {
		return nil, fmt.Errorf("bench agent: the agent: %w", err)
	}
	agentDone <- nil
	stopSrv()
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return nil, err
	}
	return r, nil
}

// postIntake posts one array of envelopes to the intake, as postbox send
// does, and fails unless every one was queued.
func postIntake(ctx context.Context, hc *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("the intake answered %s: %.300s", resp.Status, data)
	}
	var out struct {
		Events []struct {
			Status string `json:"status"`
		} `json:"events"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return fmt.Errorf("the intake's answer: %w", err)
	}
	for _, e := range out.Events {
		if e.Status != "queued" {
			return errors.New("the intake answered " + e.Status + " for a new event")
		}
	}
	return nil
}

// agentProgress prints, once a second until done closes, how many of
// total events are queued in the outbox and delivered.
func agentProgress(w io.Writer, queued, delivered *atomic.Int64, total int64, start time.Time, done chan struct{}) {
	everySecond(delivered, start, done, func(n int64, rate float64) {
		fmt.Fprintf(w, "bench agent: %d/%d queued, %d delivered, %.0f events/s now\n", queued.Load(), total, n, rate)
	})
}
