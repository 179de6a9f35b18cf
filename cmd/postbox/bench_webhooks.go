package main

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/server"
)

// webhookBenchResult is what bench webhooks --json prints as its last line.
type webhookBenchResult struct {
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

func runBenchWebhooks(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench webhooks", "[flags]", `Posts webhooks to POST /webhooks of a server it starts itself on a temporary database
(or of --server) over keep-alive HTTP/1.1 connections, one worker per connection posting
one webhook at a time, each with its own Idempotency-Key. Then, in the same run, sends the
same load to a do-nothing net/http handler (reads the body, answers 202) on another loopback
listener and prints the ratio of the two rates. Finally checks the store holds every
accepted webhook exactly once.

A 429 is counted and its webhook sent again after Retry-After. Latency is one POST's round
trip (request written, answer read), over every answer but 429s. The rate counts 202s.
Progress goes to stderr; --json prints one JSON object as the last line of stdout.`)
	connections := positiveInt(64)
	fs.Var(&connections, "connections", "keep-alive `connections`, each posting one webhook at a time")
	requests := positiveInt(200000)
	fs.Var(&requests, "requests", "`webhooks` in all, shared among the connections")
	payloadBytes := positiveInt(300)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each JSON body in `bytes`")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "the started server's most `events` per group commit")
	sync := fs.String("synchronous", "FULL", "the started server's SQLite synchronous mode")
	srvURL := fs.String("server", "", "a running server (http://host:port) instead of starting one")
	dbPath := fs.String("db", "", "with --server: its database file, to check what was stored")
	baseline := fs.Bool("baseline", true, "also run the same load against a do-nothing net/http handler")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the postbox part of the run (server and loader) to this file")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if *srvURL != "" && !strings.HasPrefix(*srvURL, "http://") && !strings.HasPrefix(*srvURL, "https://") {
		return usagef("--server %q: give an http:// or https:// URL", *srvURL)
	}
	res := webhookBenchResult{Requests: int(requests), Connections: int(connections), PayloadBytes: int(payloadBytes),
		MaxBatch: int(maxBatch), Synchronous: strings.ToUpper(*sync), Stored: -1}

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srv *server.Server
	base := strings.TrimRight(*srvURL, "/")
	if base == "" {
		var addr string
		var cleanup func()
		var err error
		srv, addr, cleanup, err = startBenchServer(srvCtx, g, stopSrv, server.Config{MaxBatch: int(maxBatch), Synchronous: res.Synchronous})
		if err != nil {
			return err
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
		return serverFailed(err)
	}

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	prefix := "wh_bench_" + run + "_"
	load := webhookLoad{conns: int(connections), n: int(requests), payload: webhookBenchPayload(int(payloadBytes))}
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	before, werr := scrapeWriter(gctx, base+"/metrics")
	pb, err := load.run(gctx, env, "postbox", base+"/webhooks", prefix)
	stopProfile()
	if err != nil {
		return serverFailed(err)
	}
	res.fill(pb)
	if after, err := scrapeWriter(gctx, base+"/metrics"); err == nil && werr == nil {
		res.WriterCommits = int64(after.commits - before.commits)
		if res.WriterCommits > 0 {
			res.WriterMeanBatch = (after.entries - before.entries) / float64(res.WriterCommits)
		}
		res.WriterBusy = (after.seconds - before.seconds) / res.DurationS
	}

	res.Stored, res.Duplicates, err = checkStored(ctx, srv, *dbPath, server.WebhookSource, prefix)
	if err != nil {
		return fmt.Errorf("bench webhooks: check store: %w", err)
	}
	// The baseline runs with the started server stopped, so that it gets
	// the machine the server had.
	stopSrv()
	if err := g.Wait(); err != nil && ctx.Err() == nil {
		return err
	}
	fmt.Fprintf(env.stderr, "bench webhooks: postbox: %d accepted (202) in %.2fs: %.0f/s, p50 %.2f ms, p99 %.2f ms, max %.2f ms, statuses %v, stored %d (%d duplicate rows)\n",
		res.Accepted, res.DurationS, res.AcceptedPerS, res.P50Ms, res.P99Ms, res.MaxMs, res.Statuses, res.Stored, res.Duplicates)
	fmt.Fprintf(env.stderr, "bench webhooks: postbox: writer: %d commits of %.1f entries on average, committing %.0f%% of the time\n",
		res.WriterCommits, res.WriterMeanBatch, 100*res.WriterBusy)

	if *baseline {
		bl, err := runNullBaseline(ctx, env, load)
		if err != nil {
			return fmt.Errorf("bench webhooks: baseline: %w", err)
		}
		res.BaselinePerS = bl.perS()
		res.BaselineP50Ms, res.BaselineP99Ms, res.BaselineMaxMs = bl.quantile(0.50), bl.quantile(0.99), bl.quantile(1)
		if res.BaselinePerS > 0 {
			res.Ratio = res.AcceptedPerS / res.BaselinePerS
		}
		fmt.Fprintf(env.stderr, "bench webhooks: do-nothing handler: %.0f/s, p50 %.2f ms, p99 %.2f ms; postbox/do-nothing %.3f\n",
			res.BaselinePerS, res.BaselineP50Ms, res.BaselineP99Ms, res.Ratio)
	}
	res.PeakRSSMB = peakRSSMB()
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(env.stdout, string(b))
	}
	answered := pb.statuses[http.StatusAccepted] + pb.statuses[http.StatusOK]
	if answered != int64(requests) || (res.Stored >= 0 && (res.Stored != answered || res.Duplicates != 0)) {
		return fmt.Errorf("bench webhooks: %d sent, %d answered 202 or 200 (statuses %v), %d stored, %d stored twice",
			requests, answered, res.Statuses, res.Stored, res.Duplicates)
	}
	return nil
}

func (r *webhookBenchResult) fill(s loadStats) {
	r.Statuses = map[string]int64{}
	for code, n := range s.statuses {
		r.Statuses[strconv.Itoa(code)] = n
	}
	r.Accepted = s.statuses[http.StatusAccepted]
	r.DurationS = s.dur.Seconds()
	r.AcceptedPerS = s.perS()
	r.P50Ms, r.P99Ms, r.MaxMs = s.quantile(0.50), s.quantile(0.99), s.quantile(1)
}

// waitReady polls url until it answers 200.
func waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	last := errors.New("no answer")
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		switch {
		case err == nil:
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("answered %s", resp.Status)
		case ctx.Err() == nil:
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %v)", url, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// writerStats are the server's writer counters.
type writerStats struct{ commits, entries, seconds float64 }

// scrapeWriter reads the writer's counters from the server's /metrics.
func scrapeWriter(ctx context.Context, url string) (writerStats, error) {
	var ws writerStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return ws, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ws, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return ws, err
	}
	if resp.StatusCode != http.StatusOK {
		return ws, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	for line := range strings.Lines(string(b)) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "postbox_writer_commit_seconds_count":
			dst = &ws.commits
		case "postbox_writer_commit_seconds_sum":
			dst = &ws.seconds
		case "postbox_writer_batch_events_sum":
			dst = &ws.entries
		default:
			continue
		}
		if *dst, err = strconv.ParseFloat(v, 64); err != nil {
			return ws, fmt.Errorf("GET %s: %s: %w", url, name, err)
		}
	}
	return ws, nil
}

// runNullBaseline runs load against a do-nothing handler on a loopback
// listener of its own: what net/http and the loader cost by themselves.
func runNullBaseline(ctx context.Context, env *cmdEnv, load webhookLoad) (loadStats, error) {
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
	st, err := load.run(ctx, env, "do-nothing", "http://"+ln.Addr().String()+"/webhooks", "null_")
	hs.Close()
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return st, err
}

// webhookLoad is the generator: conns workers, each on its own keep-alive
// connection, post n webhooks in all, one at a time.
type webhookLoad struct {
	conns, n int
	payload  []byte
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
func (l webhookLoad) run(ctx context.Context, env *cmdEnv, label, url, prefix string) (loadStats, error) {
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
		webhookProgress(env, label, &answered, int64(l.n), start, progressDone)
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

// webhookBenchPayload returns a JSON body of about size bytes shaped like a
// payment provider's event.
func webhookBenchPayload(size int) []byte {
	base := `{"object":"event","type":"invoice.paid","created":1763683200,"livemode":false,` +
		`"data":{"object":{"id":"in_1QbenchA2b3C4d5E","object":"invoice","amount_paid":4200,"currency":"eur",` +
		`"customer":"cus_bench0001","status":"paid","description":"`
	pad := max(size-len(base)-4, 0)
	return []byte(base + strings.Repeat("x", pad) + `"}}}`)
}

func webhookProgress(env *cmdEnv, label string, answered *atomic.Int64, total int64, start time.Time, done chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastT := int64(0), start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			n := answered.Load()
			fmt.Fprintf(env.stderr, "bench webhooks: %s: %d/%d answered, %.0f/s now\n", label, n, total, float64(n-last)/now.Sub(lastT).Seconds())
			last, lastT = n, now
		}
	}
}
