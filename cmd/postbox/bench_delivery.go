package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/postbox-events/postbox/internal/bench"
	"github.com/postbox-events/postbox/internal/delivery"
)

func runBenchDelivery(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "bench delivery", "[flags]", `Measures the workers: how fast items are leased, POSTed to a target and acked. It starts
--nodes servers in this process on the delivery store --store and the stream backend
--streams, with a target of its own that answers 200 at once, appends --items events to a
source, lets a subscription without a target materialise them as pending items, then sets the
target and times until every item is completed. With --baseline (the default, on an SQLite
--store), it then runs, with the servers stopped, a minimal River-style loop on a SQLite file of
its own with postbox's settings (WAL, synchronous FULL): it leases a batch with one
UPDATE … RETURNING, POSTs each item to a do-nothing target with --workers workers and completes
them in group commits of up to 1,000, for the same items and payload; and prints the ratio.

A postgres:// --store or --streams without ?schema= gets a schema of the run's own, dropped at
the end; a nats:// --streams gets a prefix of its own, deleted at the end. Several --nodes need
a store and streams they share: --store postgres://… with --streams nats://… or postgres://….

--keys spreads the events over that many orders (the payload's "order": o-0, o-1, …);
--order-by makes the subscription ordered per key (--order-by /order: one item of an
order in flight at a time). Run with and without --order-by, same --keys, to compare.
--runs puts each order's events together (o-0's, then o-1's, …) instead of in turn.`)
	storeSpec := fs.String("store", "sqlite", "delivery `store`: sqlite (a temporary file) or postgres://…[?schema=NAME]")
	streams := fs.String("streams", "sqlite", "stream `backend`: sqlite, nats://host:4222 or postgres://…[?schema=NAME]")
	nodes := positiveInt(1)
	fs.Var(&nodes, "nodes", "`servers` sharing the store, in this process")
	items := positiveInt(20000)
	fs.Var(&items, "items", "`items` to deliver")
	workers := positiveInt(delivery.DefaultWorkers)
	fs.Var(&workers, "workers", "`workers` of each node")
	sign := fs.Bool("sign", false, "give the target a signing secret: every request carries Standard Webhooks signatures")
	baseline := fs.Bool("baseline", true, "also run the River-style loop on SQLite and print postbox's ratio to it (SQLite --store only)")
	orderBy := fs.String("order-by", "", "the subscription's `order_by`: ordered delivery per key, e.g. /order (default: unordered)")
	keys := fs.Int("keys", 0, "spread the events over this many `orders` (payload \"order\": o-0, o-1, …); 0: all of o-1")
	runs := fs.Bool("runs", false, "with --keys, each order's events together instead of in turn")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the delivery part of the run to this file")
	traceFile := fs.String("trace", "", "write an execution trace (go tool trace) of the delivery part of the run to this file")
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
	if *keys < 0 {
		return usagef("--keys %d: want 0 or more", *keys)
	}
	secret := ""
	if *sign {
		key := make([]byte, 32)
		rand.Read(key)
		secret = "whsec_" + base64.StdEncoding.EncodeToString(key)
	}
	res, err := bench.Delivery(ctx, bench.DeliveryConfig{
		Store: *storeSpec, Streams: *streams, StreamsKind: kind,
		Nodes: int(nodes), Items: int(items), Workers: int(workers),
		Secret: secret, OrderBy: *orderBy, Keys: *keys, Runs: *runs, Baseline: *baseline, CPUProfile: *cpuprofile, Trace: *traceFile, Open: openBench, Progress: env.stderr,
	})
	if err != nil {
		return benchErr(err)
	}
	if *asJSON {
		return json.NewEncoder(env.stdout).Encode(res)
	}
	signed := ""
	if res.Signed {
		signed = ", signed"
	}
	if res.OrderBy != "" {
		signed += ", ordered by " + res.OrderBy
	}
	if res.Keys > 0 {
		signed += fmt.Sprintf(", %d keys", res.Keys)
	}
	if res.Runs {
		signed += " in runs"
	}
	fmt.Fprintf(env.stdout, "delivered %d items in %.2fs: %.0f items/s (%d node(s) × %d workers, store %s, streams %s; %d POSTs%s)\n",
		res.Items, res.Seconds, res.ItemsPerSec, res.Nodes, res.Workers, res.Store, res.Streams, res.Posts, signed)
	if res.BaselineItemsPerSec > 0 {
		fmt.Fprintf(env.stdout, "River-style loop: %d items in %.2fs: %.0f items/s; postbox/loop %.3f\n",
			res.Items, res.BaselineSeconds, res.BaselineItemsPerSec, res.Ratio)
	}
	return nil
}
