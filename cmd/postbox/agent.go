package main

import (
	"context"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/retry"
)

// The agent's window and frame: twice the relay's defaults, because the
// agent sends over one connection what a server takes from many devices,
// and the window of 4,096 events of 256 held the agent path at 0.8 of
// this (bench agent, BENCHMARKS.md).
const (
	agentWindow = 2 * outbox.DefaultMaxInFlight
	agentBatch  = 2 * outbox.DefaultBatchSize
)

func runAgent(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "agent", "--server URL --outbox FILE --device-id ID [flags]", `Runs the edge agent: a durable SQLite outbox, a local HTTP intake (POST /v1/events answers 202
after the outbox commit) and a sender that keeps a window of events in flight over one WebSocket or gRPC stream,
deletes each row only on its ACK, keeps refused rows as rejected, and reconnects with exponential
backoff and full jitter. The window starts at --window-min, grows with every ACK up to --window,
and after a dropped connection starts again from what that connection got acknowledged. Unsent
events are resumed after a restart. With OTEL_EXPORTER_OTLP_ENDPOINT set, each publish is a span
exported over OTLP (docs/TRACING.md).`)
	server := fs.String("server", "", "the control plane's ingress, ws://HOST:PORT or grpc://HOST:PORT (wss://, grpcs:// for TLS) [POSTBOX_SERVER]")
	path := fs.String("outbox", "outbox.db", "outbox SQLite file [POSTBOX_OUTBOX]")
	device := fs.String("device-id", "", "this device's id, filled into events without one [POSTBOX_DEVICE_ID]")
	listen := fs.String("listen", "127.0.0.1:8787", "address of the local intake [POSTBOX_AGENT_LISTEN]")
	token := fs.String("token", "", "bearer token for the server [POSTBOX_TOKEN]")
	source := fs.String("source", "", "the server's device `source` the events go to (postbox sources create NAME --kind device); default: devices")
	caCert := fs.String("ca-cert", "", "PEM file of the CA (or self-signed certificate) a wss:// or grpcs:// server must present; default: the system's roots [POSTBOX_CA_CERT]")
	session := fs.String("session-id", "", "session id filled into events without one (default: a new one per run)")
	sync := fs.String("synchronous", "FULL", "outbox SQLite synchronous mode: FULL or NORMAL")
	walCheckpoint := choice{value: "auto", choices: []string{"auto", "litestream"}}
	fs.Var(&walCheckpoint, "wal-checkpoint", "who checkpoints the outbox's write-ahead log, a `mode`: auto (postbox) or litestream (never postbox: Litestream, which replicates --outbox; docs/LITESTREAM.md) [POSTBOX_WAL_CHECKPOINT]")
	window := positiveInt(agentWindow)
	fs.Var(&window, "window", "most `events` sent and not yet answered; the window grows up to this")
	windowMin := positiveInt(outbox.DefaultMinInFlight)
	fs.Var(&windowMin, "window-min", "`events` the window starts at and never falls below after a dropped connection")
	batch := positiveInt(agentBatch)
	fs.Var(&batch, "batch", "most `events` per frame")
	backoffMax := durationVar(fs, "backoff-max", outbox.DefaultReconnectMax, 1, "cap of the reconnect backoff")
	retryMax := durationVar(fs, "retry-max", outbox.DefaultRetryMax, 1, "cap of the delay before resending an event the server could not store")
	ackTimeout := durationVar(fs, "ack-timeout", 30*time.Second, 1, "how long to wait for replies before giving the connection up")
	level := fs.String("log-level", "info", "debug, info, warn or error [LOG_LEVEL]")
	format := fs.String("log-format", "pretty", "json or pretty [LOG_FORMAT]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if *server == "" || *device == "" {
		return usagef("agent: --server and --device-id are required")
	}
	log, err := newLogger(env.stderr, *level, *format)
	if err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, env, "postbox-agent", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	a, err := agent.New(agent.Config{
		Server: *server, OutboxPath: *path, DeviceID: *device, SessionID: *session, Listen: *listen, Token: *token, Source: *source, CACert: *caCert,
		Synchronous: strings.ToUpper(*sync), WALCheckpoint: walCheckpoint.value, AckTimeout: *ackTimeout, Logger: log,
		Relay: outbox.RelayConfig{
			BatchSize: int(batch), MaxInFlight: int(window), MinInFlight: int(windowMin),
			Retry:     retry.Backoff{Base: outbox.DefaultRetryBase, Max: *retryMax},
			Reconnect: retry.Backoff{Base: outbox.DefaultReconnectBase, Max: *backoffMax},
		},
	})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
