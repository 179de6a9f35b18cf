package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/postbox-events/postbox/internal/bench"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

func runBench(ctx context.Context, env *cmdEnv, args []string) error {
	if len(args) == 0 {
		env.offer("webhooks", "relay", "delivery", "agent")
	}
	if len(args) > 0 && args[0] == "webhooks" {
		return runBenchWebhooks(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "relay" {
		return runBenchRelay(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "delivery" {
		return runBenchDelivery(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "agent" {
		return runBenchAgent(ctx, env, args[1:])
	}
	fs := newFlags(env, "bench", "[flags]", `Plays N devices, each on its own WebSocket connection (or gRPC stream, --transport grpc),
sending events with pipelining (many frames in flight) to a server it starts itself on a
temporary database (or to --server), then checks the store holds every event exactly once. Progress goes to stderr; --json prints
one JSON object as the last line of stdout.

--raw measures the ceiling instead: the same events, prepared as the server prepares them, inserted
into a fresh database with the same table and index (same disk, same --synchronous and --max-batch)
by one writer in plain group commits of 4-row INSERTs, with no server, WebSocket or decoding.

With --streams nats://host:4222 the started server keeps its streams in NATS JetStream, under
a prefix of the run's own (BENCH_<run>_, unless the URL sets prefix=) whose streams and
consumer bucket are deleted at the end; the store check then reads the stream back through
the backend. --raw, with a nats:// --streams, publishes the same events straight to a fresh
stream made as postbox makes them (JetStream async publish, no server, no WebSocket): the
baseline postbox on JetStream is measured against.

With --streams kafka://host:9092 the same holds for Kafka: topics and consumer groups under a
prefix of the run's own (bench.<run>.) are deleted at the end, the identity index is a file in
the run's temporary directory, and --raw produces the same events with franz-go (acks=all,
idempotent producer) straight to a fresh topic made as postbox makes them.

postbox bench webhooks measures POST /webhooks instead (postbox bench webhooks --help),
postbox bench relay a transactional outbox relay (postbox bench relay --help), postbox bench
delivery the workers delivering items to a target (postbox bench delivery --help), and postbox
bench agent the agent path against direct ingest (postbox bench agent --help).`)
	devices := positiveInt(50)
	fs.Var(&devices, "devices", "`devices` (connections)")
	events := positiveInt(200000)
	fs.Var(&events, "events", "`events` in all, shared among the devices")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "the started server's most `events` per group commit (1 = a transaction per event)")
	frame := positiveInt(64)
	fs.Var(&frame, "frame", "`envelopes` per frame")
	window := positiveInt(128)
	fs.Var(&window, "window", "most unacknowledged `envelopes` per device")
	payloadBytes := payloadSize(300)
	fs.Var(&payloadBytes, "payload-bytes", "approximate size of each payload in `bytes`")
	rate := fs.Float64("rate", 0, "offered events/s over all devices (0 = as fast as acks allow)")
	srvURL := fs.String("server", "", "a running server (ws://host:port or grpc://host:port) instead of starting one")
	transport := choice{value: bench.TransportWebSocket, choices: []string{bench.TransportWebSocket, bench.TransportGRPC}}
	fs.Var(&transport, "transport", "`transport` the devices use to reach the started server: websocket or grpc")
	dbPath := fs.String("db", "", "with --server: its database file, to check what was stored")
	sync := fs.String("synchronous", "FULL", "the started server's SQLite synchronous mode")
	token := fs.String("token", "", "bearer token for --server")
	asJSON := fs.Bool("json", false, "print the result as one JSON object on the last line")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the run (server and loader) to this file")
	traceFile := fs.String("trace", "", "write an execution trace (go tool trace) of the run (server and loader) to this file")
	streams := fs.String("streams", "sqlite", "the started server's stream `backend`: sqlite (its temporary database), nats://host:4222[?replicas=3&prefix=NAME] or kafka://host:9092[?replication_factor=3&prefix=NAME]")
	queueSize := positiveInt(groupcommit.DefaultQueueSize)
	fs.Var(&queueSize, "queue-size", "the started server's writer queue bound in `events`")
	raw := fs.Bool("raw", false, "the baseline, without a postbox server: insert the events into a fresh SQLite database in plain group commits, or with --streams nats://… or kafka://… publish them straight to JetStream or Kafka")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	kind, err := streamsKind(*streams)
	if err != nil {
		return err
	}
	if *srvURL != "" && (isSet(fs, "streams") || *raw) {
		return usagef("--streams and --raw are for the server bench starts, not with --server")
	}
	if *srvURL != "" && isSet(fs, "transport") {
		return usagef("--transport is for the server bench starts; with --server its URL's scheme says")
	}
	var kcfg streamkafka.Config
	if kind == "kafka" {
		if kcfg, err = parseKafkaStreams(*streams, ""); err != nil {
			return err
		}
	}
	res, err := bench.Ingest(ctx, bench.IngestConfig{
		Devices: int(devices), Events: int(events), Frame: int(frame), Window: int(window),
		PayloadBytes: int(payloadBytes), Rate: *rate,
		Server: *srvURL, Token: *token, DBPath: *dbPath, Transport: transport.value,
		MaxBatch: int(maxBatch), QueueSize: int(queueSize), Synchronous: *sync,
		Streams: *streams, StreamsKind: kind, Kafka: kcfg, Raw: *raw,
		CPUProfile: *cpuprofile, Trace: *traceFile, Open: openBench, Progress: env.stderr,
	})
	if err != nil {
		return benchErr(err)
	}
	fmt.Fprintf(env.stderr, "bench: %d events acked in %.2fs: %.0f events/s, ack p50 %.2f ms, p99 %.2f ms, stored %d (%d duplicates), peak RSS %.0f MB\n",
		res.Acked, res.DurationS, res.EventsPerS, res.AckP50Ms, res.AckP99Ms, res.Stored, res.Duplicates, res.PeakRSSMB)
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(env.stdout, string(b))
	}
	return res.Check()
}

// openBench opens the backends of a server a bench starts, as serve
// opens them, with no log.
func openBench(cfg *server.Config, streams, store string) (func(), error) {
	return openBackends(cfg, streams, store, slog.New(slog.DiscardHandler))
}

// benchErr makes a bench's configuration mistake a usage error (exit
// status 2); other errors pass through.
func benchErr(err error) error {
	var ue *bench.UsageError
	if errors.As(err, &ue) {
		return usagef("%s", ue.Msg)
	}
	return err
}
