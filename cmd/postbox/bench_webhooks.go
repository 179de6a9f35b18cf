package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/postbox-events/postbox/internal/bench"
	"github.com/postbox-events/postbox/internal/groupcommit"
)

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
	payloadBytes := payloadSize(300)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each JSON body in `bytes`")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "the started server's most `events` per group commit")
	sync := fs.String("synchronous", "FULL", "the started server's SQLite synchronous mode")
	srvURL := fs.String("server", "", "a running server (http://host:port) instead of starting one")
	dbPath := fs.String("db", "", "with --server: its database file, to check what was stored")
	baseline := fs.Bool("baseline", true, "also run the same load against a do-nothing net/http handler")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the postbox part of the run (server and loader) to this file")
	traceFile := fs.String("trace", "", "write an execution trace (go tool trace) of the postbox part of the run to this file")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *srvURL != "" && !strings.HasPrefix(*srvURL, "http://") && !strings.HasPrefix(*srvURL, "https://") {
		return usagef("--server %q: give an http:// or https:// URL", *srvURL)
	}
	res, err := bench.Webhooks(ctx, bench.WebhooksConfig{
		Connections: int(connections), Requests: int(requests), PayloadBytes: int(payloadBytes),
		Server: *srvURL, DBPath: *dbPath, MaxBatch: int(maxBatch), Synchronous: *sync, Baseline: *baseline,
		CPUProfile: *cpuprofile, Trace: *traceFile, Open: openBench, Progress: env.stderr,
	})
	if err != nil {
		return benchErr(err)
	}
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(env.stdout, string(b))
	}
	return res.Check()
}
