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
}

// Delivery measures the workers: it starts cfg.Nodes servers with a
// target of its own that answers 200 at once, appends cfg.Items events to
// a source, lets a subscription without a target materialise them as
// pending items, then sets the target and times until every item is
// completed.
func Delivery(ctx context.Context, cfg DeliveryConfig) (*DeliveryResult, error) {
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
	if err := fill(gctx, srvs[0].Streams(), source, "bench_"+run+"_", cfg.Items); err != nil {
		return nil, err
	}
	api := addrs[0] + "/v1/subscriptions"
	if err := callAPI(gctx, http.MethodPost, api, map[string]any{"name": source, "source": source, "start": "earliest"}); err != nil {
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
		Signed: cfg.Secret != ""}, nil
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

// fill appends n small events to source, in batches.
func fill(ctx context.Context, b stream.Backend, source, prefix string, n int) error {
	if _, err := b.EnsureStream(ctx, source); err != nil {
		return err
	}
	payload := json.RawMessage(`{"order":"o-1","amount":1299,"currency":"EUR"}`)
	for i := 0; i < n; {
		evs := make([]stream.Event, 0, 500)
		for ; i < n && len(evs) < cap(evs); i++ {
			evs = append(evs, stream.Event{NativeID: prefix + strconv.Itoa(i), Type: "bench", OccurredAt: time.Now(),
				Metadata: json.RawMessage(`{}`), Payload: payload})
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
