// Package bench holds postbox's load generators and what they measure:
// ingest over WebSocket (Ingest), with raw JetStream and Kafka baselines,
// POST /webhooks against a do-nothing net/http handler (Webhooks), the
// transactional outbox relay (Relay) and the delivery workers (Delivery).
//
// Each bench runs against a server it starts in this process (through an
// OpenFunc the caller gives, so that backends are opened as postbox serve
// opens them) or against a running one, checks that what it sent was
// stored exactly once, and returns a result whose JSON field names are
// the ones BENCHMARKS.md and scripts read. Progress lines go to the
// Progress writer of each Config; parsing flags and printing results are
// the caller's.
package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// UsageError is a mistake in a bench's configuration, worded after the
// flag that sets it: what a command reports as a usage error.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// OpenFunc opens the stream backend streams and the delivery store store
// (values of postbox serve's --streams and --store) into cfg, as postbox
// serve opens them, with cfg.DBPath holding what neither holds, and
// returns a function that closes them.
type OpenFunc func(cfg *server.Config, streams, store string) (close func(), err error)

// startServer runs a server for cfg, on the stream backend streams and
// the delivery store store opened by open, on a temporary database on a
// loopback port in g until ctx ends, and returns it with its address and
// a cleanup to defer: it stops the server (stop cancels ctx), waits for
// it and then removes its directory.
func startServer(ctx context.Context, g *errgroup.Group, stop context.CancelFunc, open OpenFunc, cfg server.Config, streams, store string) (*server.Server, string, func(), error) {
	if open == nil {
		return nil, "", nil, errors.New("bench: no OpenFunc to start a server with")
	}
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
	closeBackends, err := open(&cfg, streams, store)
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

// progressOut returns w, or io.Discard when w is nil.
func progressOut(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
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
	return parseWriterStats(url, string(b))
}

// parseWriterStats reads the writer's counters from a /metrics page.
func parseWriterStats(url, page string) (writerStats, error) {
	var ws writerStats
	for line := range strings.Lines(page) {
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
		var err error
		if *dst, err = strconv.ParseFloat(v, 64); err != nil {
			return ws, fmt.Errorf("GET %s: %s: %w", url, name, err)
		}
	}
	return ws, nil
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

// redact hides the password of a URL for messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
