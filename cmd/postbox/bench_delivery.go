package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
)

// deliveryBenchResult is what postbox bench delivery reports.
type deliveryBenchResult struct {
	Store       string  `json:"store"`
	Streams     string  `json:"streams"`
	Nodes       int     `json:"nodes"`
	Workers     int     `json:"workers"`
	Items       int     `json:"items"`
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	Posts       int64   `json:"posts"` // requests the target received: Items unless an attempt was repeated
}

func runBenchDelivery(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench delivery", "[flags]", `Measures the workers: how fast items are leased, POSTed to a target and acked. It starts
--nodes servers in this process on the delivery store --store and the stream backend
--streams, with a target of its own that answers 200 at once, appends --items events to a
source, lets a subscription without a target materialise them as pending items, then sets the
target and times until every item is completed.

A postgres:// --store or --streams without ?schema= gets a schema of the run's own, dropped at
the end; a nats:// --streams gets a prefix of its own, deleted at the end. Several --nodes need
a store and streams they share: --store postgres://… with --streams nats://… or postgres://….`)
	storeSpec := fs.String("store", "sqlite", "delivery `store`: sqlite (a temporary file) or postgres://…[?schema=NAME]")
	streams := fs.String("streams", "sqlite", "stream `backend`: sqlite, nats://host:4222 or postgres://…[?schema=NAME]")
	nodes := positiveInt(1)
	fs.Var(&nodes, "nodes", "`servers` sharing the store, in this process")
	items := positiveInt(20000)
	fs.Var(&items, "items", "`items` to deliver")
	workers := positiveInt(delivery.DefaultWorkers)
	fs.Var(&workers, "workers", "`workers` of each node")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the delivery part of the run to this file")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	shared, err := storeKind(*storeSpec)
	if err != nil {
		return err
	}
	kind, err := streamsKind(*streams)
	if err != nil {
		return err
	}
	if nodes > 1 && (!shared || kind == "sqlite") {
		return usagef("--nodes %d: several nodes need --store postgres://… and --streams nats://… or postgres://…", nodes)
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var drops []func(context.Context) error
	defer func() {
		for _, drop := range drops {
			if err := drop(context.WithoutCancel(ctx)); err != nil {
				fmt.Fprintf(env.stderr, "bench delivery: cleaning up: %v\n", err)
			}
		}
	}()
	own := func(spec string) string { // a schema of the run's own
		s, drop := benchSchema(spec, "bench_"+run)
		if drop != nil {
			drops = append(drops, drop)
		}
		return s
	}
	if shared {
		*storeSpec = own(*storeSpec)
	}
	switch kind {
	case "postgres":
		*streams = own(*streams)
	case "nats":
		bn, err := newBenchNATS(*streams, run)
		if err != nil {
			return err
		}
		*streams = bn.spec
		drops = append(drops, bn.drop)
	}

	var posts atomic.Int64
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		w.WriteHeader(http.StatusOK)
	})}
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go target.Serve(tln)
	defer target.Close()

	g, gctx := errgroup.WithContext(ctx)
	srvCtx, stopSrv := context.WithCancel(gctx)
	defer stopSrv()
	var srvs []*server.Server
	var addrs []string
	for i := range int(nodes) {
		cfg := server.Config{Delivery: delivery.Config{Workers: int(workers), Node: fmt.Sprintf("bench-%d", i+1)}}
		srv, addr, cleanup, err := startBenchServerOn(srvCtx, g, stopSrv, cfg, *streams, *storeSpec)
		if err != nil {
			return err
		}
		defer cleanup()
		srvs, addrs = append(srvs, srv), append(addrs, "http://"+addr)
	}
	for _, a := range addrs {
		if err := waitReady(gctx, a+"/ready"); err != nil {
			return err
		}
	}
	const source = "bench"
	if err := benchFill(gctx, srvs[0].Streams(), source, "bench_"+run+"_", int(items)); err != nil {
		return err
	}
	api := addrs[0] + "/v1/subscriptions"
	if err := benchCall(gctx, http.MethodPost, api, map[string]any{"name": source, "source": source, "start": "earliest"}); err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "bench delivery: materialising %d items\n", items)
	if err := benchWaitInbox(gctx, addrs[0], source, func(c inboxCount) bool { return c.Pending == int64(items) }); err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "bench delivery: delivering through %d node(s) × %d workers\n", nodes, workers)
	stopProfile, err := startCPUProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	start := time.Now()
	if err := benchCall(gctx, http.MethodPatch, api+"/"+source, map[string]any{"target": "http://" + tln.Addr().String() + "/"}); err != nil {
		return err
	}
	if err := benchWaitInbox(gctx, addrs[0], source, func(c inboxCount) bool { return c.Completed == int64(items) }); err != nil {
		return err
	}
	took := time.Since(start)
	res := deliveryBenchResult{Store: strings.SplitN(*storeSpec, ":", 2)[0], Streams: kind, Nodes: int(nodes), Workers: int(workers),
		Items: int(items), Seconds: took.Seconds(), ItemsPerSec: float64(items) / took.Seconds(), Posts: posts.Load()}
	if *asJSON {
		return json.NewEncoder(env.stdout).Encode(res)
	}
	fmt.Fprintf(env.stdout, "delivered %d items in %.2fs: %.0f items/s (%d node(s) × %d workers, store %s, streams %s; %d POSTs)\n",
		res.Items, res.Seconds, res.ItemsPerSec, res.Nodes, res.Workers, res.Store, res.Streams, res.Posts)
	return nil
}

// benchSchema gives a postgres:// spec without ?schema= the schema
// schema, and returns a function that drops it; other specs come back as
// they are, with no function.
func benchSchema(spec, schema string) (string, func(context.Context) error) {
	u, err := url.Parse(spec)
	if err != nil || !strings.HasPrefix(strings.ToLower(u.Scheme), "postgres") || u.Query().Has("schema") {
		return spec, nil
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	base, _, _ := splitSchema(u.String(), "")
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

// benchFill appends n small events to source, in batches.
func benchFill(ctx context.Context, b stream.Backend, source, prefix string, n int) error {
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

// benchCall sends body as JSON to the operator API and wants a 2xx.
func benchCall(ctx context.Context, method, u string, body any) error {
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

type inboxCount struct {
	Inbox      string `json:"inbox"`
	Pending    int64  `json:"pending"`
	Processing int64  `json:"processing"`
	Completed  int64  `json:"completed"`
	Failed     int64  `json:"failed"`
}

// benchWaitInbox polls the inbox's counts until done says so.
func benchWaitInbox(ctx context.Context, base, inbox string, done func(inboxCount) bool) error {
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
