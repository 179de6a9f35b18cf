package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// DeliveryConfig is a run of Delivery. Counts are positive; the caller
// validates them.
type DeliveryConfig struct {
	// Store is the delivery store (a --store value: sqlite or
	// postgres://…[?schema=NAME]) and Streams the stream backend (a
	// --streams value) of every node, StreamsKind its kind (sqlite, nats
	// or postgres). A postgres:// one without ?schema= gets a schema of
	// the run's own, dropped at the end; a nats:// one a prefix of its
	// own, deleted at the end. Several Nodes need a store and streams
	// they share; the caller checks that.
	Store, Streams, StreamsKind string

	Nodes   int // servers sharing the store, in this process
	Items   int // items to deliver
	Workers int // delivery workers of each node

	// Secret, when set, is the target's signing secret (whsec_…): every
	// request is then signed, and the target checks it carries a
	// signature.
	Secret string

	// OrderBy, when set, is the subscription's order_by (ordered delivery
	// per key; "/order" keys by the payload's order). Keys spreads the
	// events' payloads over that many orders (o-0, o-1, …) round-robin;
	// 0: every event is of order o-1. Runs puts each order's events
	// together (o-0's, then o-1's, …) instead.
	OrderBy string
	Keys    int
	Runs    bool

	// Baseline also runs, after postbox and with its servers stopped, a
	// minimal River-style loop on a SQLite file of its own with postbox's
	// settings (see riverLoop) delivering the same number of items with
	// the same payload to a target of the same kind, and reports the
	// ratio. Only with an SQLite store.
	Baseline bool

	CPUProfile string    // a file for a CPU profile of the delivery part; empty: none
	Trace      string    // a file for an execution trace of the delivery part; empty: none
	Open       OpenFunc  // opens each node's backends
	Progress   io.Writer // progress lines; nil: discarded
}

// DeliveryResult is what Delivery measured; as JSON, the object bench
// delivery --json prints.
type DeliveryResult struct {
	Store       string  `json:"store"`
	Streams     string  `json:"streams"`
	Nodes       int     `json:"nodes"`
	Workers     int     `json:"workers"`
	Items       int     `json:"items"`
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	Posts       int64   `json:"posts"`  // requests the target received: Items unless an attempt was repeated
	Signed      bool    `json:"signed"` // every request carried a webhook-signature (Secret was set)
	OrderBy     string  `json:"order_by,omitempty"`
	Keys        int     `json:"keys,omitempty"`
	Runs        bool    `json:"runs,omitempty"`

	// BaselineItemsPerSec is the River-style loop's rate (Baseline), and
	// Ratio ItemsPerSec / BaselineItemsPerSec; zero without a baseline.
	BaselineItemsPerSec float64 `json:"baseline_items_per_sec,omitempty"`
	BaselineSeconds     float64 `json:"baseline_seconds,omitempty"`
	Ratio               float64 `json:"ratio,omitempty"`
}

// Delivery measures the workers: it starts cfg.Nodes servers with a
// target of its own that answers 200 at once, appends cfg.Items events to
// a source, lets a subscription without a target materialise them as
// pending items, then sets the target and times until every item is
// completed.
func Delivery(ctx context.Context, cfg DeliveryConfig) (*DeliveryResult, error) {
	res, err := deliverPostbox(ctx, cfg)
	if err != nil || !cfg.Baseline || res.Store != "sqlite" {
		return res, err
	}
	progress := progressOut(cfg.Progress)
	fmt.Fprintf(progress, "bench delivery: postbox: %.0f items/s; now the River-style loop\n", res.ItemsPerSec)
	took, err := riverLoop(ctx, cfg.Items, cfg.Workers)
	if err != nil {
		return nil, fmt.Errorf("bench delivery: baseline: %w", err)
	}
	res.BaselineSeconds = took.Seconds()
	res.BaselineItemsPerSec = float64(cfg.Items) / took.Seconds()
	res.Ratio = res.ItemsPerSec / res.BaselineItemsPerSec
	return res, nil
}

// benchPayload is the payload of every event Delivery delivers, and of
// every job of its baseline.
const benchPayload = `{"order":"o-1","amount":1299,"currency":"EUR"}`

func deliverPostbox(ctx context.Context, cfg DeliveryConfig) (*DeliveryResult, error) {
	progress := progressOut(cfg.Progress)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var drops []func(context.Context) error
	defer func() {
		for _, drop := range drops {
			if err := drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(progress, "bench delivery: cleaning up: %v\n", err)
			}
		}
	}()
	own := func(spec string) string { // a schema of the run's own
		s, drop := ownSchema(spec, "bench_"+run)
		if drop != nil {
			drops = append(drops, drop)
		}
		return s
	}
	storeSpec, streams := own(cfg.Store), cfg.Streams
	switch cfg.StreamsKind {
	case "postgres":
		streams = own(streams)
	case "nats":
		bn, err := newBenchNATS(streams, run)
		if err != nil {
			return nil, err
		}
		streams = bn.spec
		drops = append(drops, bn.drop)
	}

	var posts, signed atomic.Int64
	allPosted := make(chan struct{}) // closed at the cfg.Items-th request
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == int64(cfg.Items) {
			close(allPosted)
		}
		if r.Header.Get("webhook-signature") != "" {
			signed.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	})}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go target.Serve(tln)
	defer target.Close()

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srvs []*server.Server
	var addrs []string
	for i := range cfg.Nodes {
		scfg := server.Config{Delivery: delivery.Config{Workers: cfg.Workers, Node: fmt.Sprintf("bench-%d", i+1)}}
		srv, addr, cleanup, err := startServer(srvCtx, g, stopSrv, cfg.Open, scfg, streams, storeSpec)
		if err != nil {
			return nil, err
		}
		defer cleanup()
		srvs, addrs = append(srvs, srv), append(addrs, "http://"+addr)
	}
	for _, a := range addrs {
		if err := waitReady(gctx, a+"/ready"); err != nil {
			return nil, err
		}
	}
	const source = "bench"
	if err := fill(gctx, srvs[0].Streams(), source, "bench_"+run+"_", cfg.Items, cfg.Keys, cfg.Runs); err != nil {
		return nil, err
	}
	api := addrs[0] + "/v1/subscriptions"
	create := map[string]any{"name": source, "source": source, "start": "earliest"}
	if cfg.OrderBy != "" {
		create["order_by"] = cfg.OrderBy
	}
	if err := callAPI(gctx, http.MethodPost, api, create); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench delivery: materialising %d items\n", cfg.Items)
	if err := waitInbox(gctx, addrs[0], source, func(c inboxCount) bool { return c.Pending == int64(cfg.Items) }); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "bench delivery: delivering through %d node(s) × %d workers\n", cfg.Nodes, cfg.Workers)
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
	start := time.Now()
	patch := map[string]any{"target": "http://" + tln.Addr().String() + "/"}
	if cfg.Secret != "" {
		patch["secret"] = cfg.Secret
	}
	if err := callAPI(gctx, http.MethodPatch, api+"/"+source, patch); err != nil {
		return nil, err
	}
	// Counting the inbox's items is a query over all of them: polled
	// while the workers deliver, it took a tenth of the server's CPU. So
	// the polls start once the target has seen every item.
	select {
	case <-allPosted:
	case <-gctx.Done():
		return nil, gctx.Err()
	}
	if err := waitInbox(gctx, addrs[0], source, func(c inboxCount) bool { return c.Completed == int64(cfg.Items) }); err != nil {
		return nil, err
	}
	took := time.Since(start)
	stopTrace()
	if cfg.Secret != "" && signed.Load() != posts.Load() {
		return nil, fmt.Errorf("bench delivery: %d of %d requests carried no webhook-signature", posts.Load()-signed.Load(), posts.Load())
	}
	return &DeliveryResult{Store: strings.SplitN(storeSpec, ":", 2)[0], Streams: cfg.StreamsKind, Nodes: cfg.Nodes, Workers: cfg.Workers,
		Items: cfg.Items, Seconds: took.Seconds(), ItemsPerSec: float64(cfg.Items) / took.Seconds(), Posts: posts.Load(),
		Signed: cfg.Secret != "", OrderBy: cfg.OrderBy, Keys: cfg.Keys, Runs: cfg.Runs && cfg.Keys > 0}, nil
}

// ownSchema gives a postgres:// spec without ?schema= the schema schema,
// and returns a function that drops it; other specs come back as they
// are, with no function.
func ownSchema(spec, schema string) (string, func(context.Context) error) {
	u, err := url.Parse(spec)
	if err != nil || !strings.HasPrefix(strings.ToLower(u.Scheme), "postgres") || u.Query().Has("schema") {
		return spec, nil
	}
	base := u.String() // without ?schema=, postbox's option and not PostgreSQL's
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return u.String(), func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		return err
	}
}

// fill appends n small events to source, in batches: their payloads are
// benchPayload, or with keys > 0 of orders o-0 … o-(keys-1) in turn (with
// runs, each order's events together).
func fill(ctx context.Context, b stream.Backend, source, prefix string, n, keys int, runs bool) error {
	if _, err := b.EnsureStream(ctx, source); err != nil {
		return err
	}
	payload := json.RawMessage(benchPayload)
	for i := 0; i < n; {
		evs := make([]stream.Event, 0, 500)
		for ; i < n && len(evs) < cap(evs); i++ {
			p := payload
			if keys > 0 {
				order := i % keys
				if runs {
					order = i * keys / n
				}
				p = json.RawMessage(strings.Replace(benchPayload, `"o-1"`, `"o-`+strconv.Itoa(order)+`"`, 1))
			}
			evs = append(evs, stream.Event{NativeID: prefix + strconv.Itoa(i), Type: "bench", OccurredAt: time.Now(),
				Metadata: json.RawMessage(`{}`), Payload: p})
		}
		res, err := b.Append(ctx, source, evs)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err != nil {
				return r.Err
			}
		}
	}
	return nil
}

// callAPI sends body as JSON to the operator API and wants a 2xx.
func callAPI(ctx context.Context, method, u string, body any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var msg bytes.Buffer
		msg.ReadFrom(resp.Body)
		return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, strings.TrimSpace(msg.String()))
	}
	return nil
}

// inboxCount is one inbox's line of GET /v1/inboxes.
type inboxCount struct {
	Inbox      string `json:"inbox"`
	Pending    int64  `json:"pending"`
	Processing int64  `json:"processing"`
	Completed  int64  `json:"completed"`
	Failed     int64  `json:"failed"`
}

// waitInbox polls the inbox's counts until done says so.
func waitInbox(ctx context.Context, base, inbox string, done func(inboxCount) bool) error {
	for {
		var body struct {
			Inboxes []inboxCount `json:"inboxes"`
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/inboxes", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
		}
		if err != nil {
			return err
		}
		for _, c := range body.Inboxes {
			if c.Inbox == inbox && done(c) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startTrace starts an execution trace (runtime/trace) into the file at
// path, and returns what stops it; a second call of stop does nothing. An
// empty path traces nothing.
func startTrace(path string) (stop func(), _ error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			trace.Stop()
			f.Close()
		})
	}, nil
}

// riverHold is how many jobs the River-style loop holds at most (leased
// and not yet handled), and riverComplete how many completions one of its
// commits carries at most.
const (
	riverHold     = 1000
	riverComplete = 1000
)

// riverLoop is the baseline of Delivery: a minimal job queue loop in the
// style of River on a SQLite file of its own, opened as postbox opens its
// database (sqlitedb.Open: WAL, synchronous FULL, the same pragmas, one
// writer connection). It inserts n jobs carrying benchPayload, then times
// their delivery: a fetcher leases the oldest available jobs with one
// UPDATE … RETURNING whenever workers or more of riverHold slots are free
// (up to all the free ones), workers goroutines POST each job's payload
// to a do-nothing target on a loopback listener of its own, and a
// completer marks the done ones completed in group commits of up to
// riverComplete (one UPDATE of the ids as a JSON array). No attempt log,
// no counts, no retries: what a queue on the same storage costs at least.
func riverLoop(ctx context.Context, n, workers int) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "postbox-bench-river-*")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	db, err := sqlitedb.Open(filepath.Join(dir, "river.db"), sqlitedb.Options{MaxConns: 1})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	now := func() string { return time.Now().UTC().Format(sqlitedb.Time) }
	if _, err := db.ExecContext(ctx, `CREATE TABLE river_job (id INTEGER PRIMARY KEY, state TEXT NOT NULL, attempt INTEGER NOT NULL,
		args TEXT NOT NULL, scheduled_at TEXT NOT NULL, attempted_at TEXT, finalized_at TEXT);
		CREATE INDEX river_job_fetch ON river_job (state, id)`); err != nil {
		return 0, err
	}
	for i := 0; i < n; i += 1000 {
		if _, err := db.ExecContext(ctx, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < ?1)
			INSERT INTO river_job (state, attempt, args, scheduled_at) SELECT 'available', 0, ?2, ?3 FROM c`,
			min(1000, n-i), benchPayload, now()); err != nil {
			return 0, err
		}
	}

	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	go target.Serve(tln)
	defer target.Close()
	url := "http://" + tln.Addr().String() + "/"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	type job struct {
		id   int64
		args string
	}
	jobs := make(chan job, riverHold)
	done := make(chan int64, riverHold)
	free := newRiverSlots(riverHold)
	g, gctx := errgroup.WithContext(ctx)
	fetchCtx, stopFetch := context.WithCancel(gctx)
	start := time.Now()
	g.Go(func() error { // the fetcher
		defer close(jobs)
		for {
			k := free.take(fetchCtx, workers)
			if k == 0 {
				return nil
			}
			rows, err := db.QueryContext(fetchCtx, `UPDATE river_job SET state = 'running', attempt = attempt + 1, attempted_at = ?1
				WHERE id IN (SELECT id FROM river_job WHERE state = 'available' AND scheduled_at <= ?1 ORDER BY id LIMIT ?2)
				RETURNING id, args`, now(), k)
			if err != nil {
				if fetchCtx.Err() != nil {
					return nil
				}
				return err
			}
			got := 0
			for rows.Next() {
				var j job
				if err := rows.Scan(&j.id, &j.args); err != nil {
					rows.Close()
					return err
				}
				jobs <- j
				got++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			free.put(k - got)
			if got == 0 { // nothing available: look again shortly
				select {
				case <-fetchCtx.Done():
					return nil
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	})
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		g.Go(func() error {
			defer wg.Done()
			for j := range jobs {
				req, err := http.NewRequestWithContext(gctx, http.MethodPost, url, strings.NewReader(j.args))
				if err != nil {
					return err
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					return fmt.Errorf("target answered %s", resp.Status)
				}
				free.put(1)
				done <- j.id
			}
			return nil
		})
	}
	go func() { wg.Wait(); close(done) }()
	var took time.Duration
	g.Go(func() error { // the completer
		completed := 0
		ids := make([]int64, 0, riverComplete)
		for id := range done {
			ids = append(ids[:0], id)
		more:
			for len(ids) < riverComplete {
				select {
				case id, ok := <-done:
					if !ok {
						break more
					}
					ids = append(ids, id)
				default:
					break more
				}
			}
			list, _ := json.Marshal(ids)
			if _, err := db.ExecContext(gctx, `UPDATE river_job SET state = 'completed', finalized_at = ?1
				WHERE id IN (SELECT value FROM json_each(?2))`, now(), string(list)); err != nil {
				return err
			}
			if completed += len(ids); completed == n {
				took = time.Since(start)
				stopFetch()
			}
		}
		return nil
	})
	err = g.Wait()
	stopFetch()
	if err != nil {
		return 0, err
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM river_job WHERE state <> 'completed'`).Scan(&left); err != nil {
		return 0, err
	}
	if left != 0 || took == 0 {
		return 0, fmt.Errorf("%d of %d jobs not completed", left, n)
	}
	return took, nil
}

// riverSlots counts the jobs riverLoop may still lease.
type riverSlots struct {
	mu    sync.Mutex
	free  int
	freed chan struct{}
}

func newRiverSlots(n int) *riverSlots { return &riverSlots{free: n, freed: make(chan struct{}, 1)} }

// take waits until at least atLeast slots are free and takes them all; 0
// when ctx ended.
func (s *riverSlots) take(ctx context.Context, atLeast int) int {
	for {
		s.mu.Lock()
		if n := s.free; n >= atLeast {
			s.free = 0
			s.mu.Unlock()
			return n
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
		case <-ctx.Done():
			return 0
		}
	}
}

func (s *riverSlots) put(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}
