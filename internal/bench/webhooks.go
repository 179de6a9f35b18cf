package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/server"
)

// WebhooksConfig is a run of Webhooks. Counts are positive; the caller
// validates them.
type WebhooksConfig struct {
	Connections  int // keep-alive connections, each posting one webhook at a time
	Requests     int // webhooks in all, shared among the connections
	PayloadBytes int // approximate size of each JSON body

	// Server is a running server's http(s):// URL; empty: Webhooks starts
	// one in this process through Open. DBPath, with Server, is its
	// database file, read to check what was stored (empty: not checked).
	Server, DBPath string

	// The started server's writer: MaxBatch and SQLite Synchronous mode,
	// as server.Config has them.
	MaxBatch    int
	Synchronous string

	// Baseline also runs the same load against a do-nothing net/http
	// handler, after the server has stopped.
	Baseline bool

	CPUProfile string    // a file for a CPU profile of the postbox part; empty: none
	Trace      string    // a file for an execution trace of the postbox part; empty: none
	Open       OpenFunc  // opens the started server's backends
	Progress   io.Writer // progress lines, one a second per part; nil: discarded
}

// WebhooksResult is what Webhooks measured; as JSON, the object bench
// webhooks --json prints.
type WebhooksResult struct {
	Requests     int   `json:"requests"`
	Connections  int   `json:"connections"`
	PayloadBytes int   `json:"payload_bytes"`
	Accepted     int64 `json:"accepted"` // answered 202
	// Statuses counts every answer by status code, each 429 included
	// (its request was sent again after Retry-After).
	Statuses     map[string]int64 `json:"statuses"`
	Stored       int64            `json:"stored"` // distinct bench webhooks found in the store; -1 when not checked
	Duplicates   int64            `json:"duplicates_stored"`
	DurationS    float64          `json:"duration_s"`
	AcceptedPerS float64          `json:"accepted_per_s"`
	P50Ms        float64          `json:"p50_ms"`
	P99Ms        float64          `json:"p99_ms"`
	MaxMs        float64          `json:"max_ms"`
	// The same load against a do-nothing net/http handler; zero with
	// --baseline=false.
	BaselinePerS  float64 `json:"baseline_per_s"`
	BaselineP50Ms float64 `json:"baseline_p50_ms"`
	BaselineP99Ms float64 `json:"baseline_p99_ms"`
	BaselineMaxMs float64 `json:"baseline_max_ms"`
	Ratio         float64 `json:"ratio"` // accepted_per_s / baseline_per_s
	// The server's writer during the postbox part, from its /metrics:
	// group commits, queue entries per commit (webhooks, and the
	// functions that materialise them into inbox items) and the share of
	// the time it spent committing.
	WriterCommits   int64   `json:"writer_commits"`
	WriterMeanBatch float64 `json:"writer_mean_batch"`
	WriterBusy      float64 `json:"writer_busy"`
	MaxBatch        int     `json:"max_batch"`
	Synchronous     string  `json:"synchronous"`
	PeakRSSMB       float64 `json:"peak_rss_mb"` // of this process (server, loader and baseline when in-process)
	Server          string  `json:"server"`
}

// Check fails unless every webhook was answered 202 or 200 and, when the
// store was checked, each answered one stored exactly once.
func (r *WebhooksResult) Check() error {
	answered := r.Statuses[strconv.Itoa(http.StatusAccepted)] + r.Statuses[strconv.Itoa(http.StatusOK)]
	if answered != int64(r.Requests) || (r.Stored >= 0 && (r.Stored != answered || r.Duplicates != 0)) {
		return fmt.Errorf("bench webhooks: %d sent, %d answered 202 or 200 (statuses %v), %d stored, %d stored twice",
			r.Requests, answered, r.Statuses, r.Stored, r.Duplicates)
	}
	return nil
}

// Webhooks posts webhooks to POST /webhooks of a server it starts (or
// cfg.Server) over keep-alive connections, each with its own
// Idempotency-Key, then, with cfg.Baseline, the same load to a
// do-nothing handler, and counts what the store holds of them. It
// returns an error when a load or the count fails; whether every webhook
// was accepted and stored once is for the result's Check.
func Webhooks(ctx context.Context, cfg WebhooksConfig) (*WebhooksResult, error) {
	progress := progressOut(cfg.Progress)
	res := &WebhooksResult{Requests: cfg.Requests, Connections: cfg.Connections, PayloadBytes: cfg.PayloadBytes,
		MaxBatch: cfg.MaxBatch, Synchronous: strings.ToUpper(cfg.Synchronous), Stored: -1}

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srv *server.Server
	base := strings.TrimRight(cfg.Server, "/")
	if base == "" {
		var addr string
		var cleanup func()
		var err error
		srv, addr, cleanup, err = startServer(srvCtx, g, stopSrv, cfg.Open,
			server.Config{MaxBatch: cfg.MaxBatch, Synchronous: res.Synchronous}, "sqlite", "sqlite")
		if err != nil {
			return nil, err
		}
		defer cleanup()
		base = "http://" + addr
		res.Server = "in-process"
	} else {
		res.Server = base
		res.MaxBatch, res.Synchronous = 0, ""
	}
	// serverFailed returns why the started server stopped, if it did,
	// instead of err: the load's error is then only its consequence.
	serverFailed := func(err error) error {
		stopSrv()
		if serr := g.Wait(); serr != nil {
			err = serr
		}
		return fmt.Errorf("bench webhooks: %w", err)
	}
	if err := waitReady(gctx, base+"/ready"); err != nil {
		return nil, serverFailed(err)
	}

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "wh_bench_" + run + "_"
	load := webhookLoad{conns: cfg.Connections, n: cfg.Requests, payload: webhookPayload(cfg.PayloadBytes), progress: progress}
	stopProfile, err := startCPUProfile(cfg.CPUProfile)
	if err != nil {
		return nil, err
	}
	stopTrace, err := startTrace(cfg.Trace)
	if err != nil {
		stopProfile()
		return nil, err
	}
	before, werr := scrapeWriter(gctx, base+"/metrics")
	pb, err := load.run(gctx, "postbox", base+"/webhooks", prefix)
	stopTrace()
	stopProfile()
	if err != nil {
		return nil, serverFailed(err)
	}
	res.fill(pb)
	if after, err := scrapeWriter(gctx, base+"/metrics"); err == nil && werr == nil {
		res.WriterCommits = int64(after.commits - before.commits)
		if res.WriterCommits > 0 {
			res.WriterMeanBatch = (after.entries - before.entries) / float64(res.WriterCommits)
		}
		res.WriterBusy = (after.seconds - before.seconds) / res.DurationS
	}

	res.Stored, res.Duplicates, err = checkStored(ctx, srv, cfg.DBPath, server.WebhookSource, prefix)
	if err != nil {
		return nil, fmt.Errorf("bench webhooks: check store: %w", err)
	}
	// The baseline runs with the started server stopped, so that it gets
	// the machine the server had.
	stopSrv()
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench webhooks: postbox: %d accepted (202) in %.2fs: %.0f/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms, statuses %v, stored %d (%d duplicate rows)\n",
		res.Accepted, res.DurationS, res.AcceptedPerS, res.P50Ms, res.P99Ms, res.MaxMs, res.Statuses, res.Stored, res.Duplicates)
	fmt.Fprintf(progress, "bench webhooks: postbox: writer: %d commits of %.1f entries on average, committing %.0f%% of the time\n",
		res.WriterCommits, res.WriterMeanBatch, 100*res.WriterBusy)

	if cfg.Baseline {
		bl, err := runNullBaseline(ctx, load)
		if err != nil {
			return nil, fmt.Errorf("bench webhooks: baseline: %w", err)
		}
		res.BaselinePerS = bl.perS()
		res.BaselineP50Ms, res.BaselineP99Ms, res.BaselineMaxMs = bl.quantile(0.50), bl.quantile(0.99), bl.quantile(1)
		if res.BaselinePerS > 0 {
			res.Ratio = res.AcceptedPerS / res.BaselinePerS
		}
		fmt.Fprintf(progress, "bench webhooks: do-nothing handler: %.0f/s, p50 %.2f ms, p99 %.2f ms; postbox/do-nothing %.3f\n",
			res.BaselinePerS, res.BaselineP50Ms, res.BaselineP99Ms, res.Ratio)
	}
	res.PeakRSSMB = peakRSSMB()
	return res, nil
}

func (r *WebhooksResult) fill(s loadStats) {
	r.Statuses = map[string]int64{}
	for code, n := range s.statuses {
		r.Statuses[strconv.Itoa(code)] = n
	}
	r.Accepted = s.statuses[http.StatusAccepted]
	r.DurationS = s.dur.Seconds()
	r.AcceptedPerS = s.perS()
	r.P50Ms, r.P99Ms, r.MaxMs = s.quantile(0.50), s.quantile(0.99), s.quantile(1)
}

// runNullBaseline runs load against a do-nothing handler on a loopback
// listener of its own: what net/http and the loader cost by themselves.
func runNullBaseline(ctx context.Context, load webhookLoad) (loadStats, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadStats{}, err
	}
	reply := []byte(`{"status":"pending"}`)
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusAccepted)
			w.Write(reply)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	st, err := load.run(ctx, "do-nothing", "http://"+ln.Addr().String()+"/webhooks", "null_")
	hs.Close()
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return st, err
}

// webhookLoad is the generator: conns workers, each on its own keep-alive
// connection, post n webhooks in all, one at a time, printing progress
// lines to progress.
type webhookLoad struct {
	conns, n int
	payload  []byte
	progress io.Writer
}

// loadStats is what one run of the generator saw.
type loadStats struct {
	statuses map[int]int64
	lat      []time.Duration // sorted, of every answer but 429
	dur      time.Duration
}

func (s loadStats) perS() float64 {
	if s.dur <= 0 {
		return 0
	}
	return float64(s.statuses[http.StatusAccepted]) / s.dur.Seconds()
}

// quantile returns the q-quantile of the latencies in milliseconds.
func (s loadStats) quantile(q float64) float64 {
	if len(s.lat) == 0 {
		return 0
	}
	i := min(int(q*float64(len(s.lat))), len(s.lat)-1)
	return float64(s.lat[i].Microseconds()) / 1000
}

// webhookWorker is one worker's share of the statistics, merged at the end.
type webhookWorker struct {
	statuses map[int]int64
	lat      []time.Duration
}

// run posts the load to url with idempotency keys prefix0, prefix1, ...
func (l webhookLoad) run(ctx context.Context, label, url, prefix string) (loadStats, error) {
	tr := &http.Transport{
		MaxConnsPerHost:     l.conns,
		MaxIdleConnsPerHost: l.conns,
		MaxIdleConns:        l.conns,
		DisableCompression:  true, // no Accept-Encoding: a provider's webhook does not ask for gzip
		IdleConnTimeout:     time.Minute,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	workers := make([]webhookWorker, l.conns)
	var next, answered atomic.Int64
	start := time.Now()
	progressDone, progressStopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(progressStopped)
		webhookProgress(l.progress, label, &answered, int64(l.n), start, progressDone)
	}()
	g, gctx := errgroup.WithContext(ctx)
	for w := range workers {
		wk := &workers[w]
		wk.statuses = map[int]int64{}
		wk.lat = make([]time.Duration, 0, l.n/l.conns+1)
		g.Go(func() error {
			for {
				i := next.Add(1) - 1
				if i >= int64(l.n) {
					return nil
				}
				key := prefix + strconv.FormatInt(i, 10)
				for {
					t0 := time.Now()
					status, retryAfter, err := postWebhookOnce(gctx, hc, url, key, l.payload)
					took := time.Since(t0)
					if err != nil {
						return fmt.Errorf("%s: POST %s: %w", label, url, err)
					}
					wk.statuses[status]++
					if status != http.StatusTooManyRequests {
						wk.lat = append(wk.lat, took)
						break
					}
					select {
					case <-time.After(retryAfter):
					case <-gctx.Done():
						return gctx.Err()
					}
				}
				answered.Add(1)
			}
		})
	}
	err := g.Wait()
	st := loadStats{statuses: map[int]int64{}, dur: time.Since(start)}
	close(progressDone)
	<-progressStopped
	for _, wk := range workers {
		for code, n := range wk.statuses {
			st.statuses[code] += n
		}
		st.lat = append(st.lat, wk.lat...)
	}
	slices.Sort(st.lat)
	return st, err
}

// postWebhookOnce posts one webhook and reads the whole answer, so that
// the connection is reused. For a 429 it returns the Retry-After wait.
func postWebhookOnce(ctx context.Context, hc *http.Client, url, key string, body []byte) (int, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header = http.Header{
		"Content-Type":    {"application/json"},
		"Idempotency-Key": {key},
		"X-Event-Type":    {"invoice.paid"},
		"User-Agent":      {"postbox-bench"},
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, 0, err
	}
	wait := time.Duration(0)
	if resp.StatusCode == http.StatusTooManyRequests {
		wait = time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			wait = time.Duration(s) * time.Second
		}
	}
	return resp.StatusCode, wait, nil
}

// webhookPayload returns a JSON body of about size bytes shaped like a
// payment provider's event.
func webhookPayload(size int) []byte {
	base := `{"object":"event","type":"invoice.paid","created":1763683200,"livemode":false,` +
		`"data":{"object":{"id":"in_1QbenchA2b3C4d5E","object":"invoice","amount_paid":4200,"currency":"eur",` +
		`"customer":"cus_bench0001","status":"paid","description":"`
	pad := max(size-len(base)-4, 0)
	return []byte(base + strings.Repeat("x", pad) + `"}}}`)
}

// webhookProgress prints, once a second until done closes, how many of
// total webhooks are answered and the rate of the last second.
func webhookProgress(w io.Writer, label string, answered *atomic.Int64, total int64, start time.Time, done chan struct{}) {
	everySecond(answered, start, done, func(n int64, rate float64) {
		fmt.Fprintf(w, "bench webhooks: %s: %d/%d answered, %.0f/s now\n", label, n, total, rate)
	})
}
