package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/forwarded"
	"github.com/postbox-events/postbox/internal/groupcommit"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/kafkaopt"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamkafka"
	"github.com/postbox-events/postbox/stream/streamnats"
	"github.com/postbox-events/postbox/stream/streampg"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

func runServe(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "serve", "[flags]", `Runs the control plane: the WebSocket ingress (`+ingress.WSPath+`), the webhook intake
(POST /webhooks), the stream backend (--streams: the SQLite file under --db by default) with a
single group-commit writer, subscriptions and their inboxes (in the SQLite file), the workers
that POST items to targets with retries and dead letters, retention (the API of docs/API.md),
/health, /ready, /metrics and the web console at /ui/ (docs/CONSOLE.md). Every event is ACKed only after the stream backend stored it (on
SQLite: its transaction committed). At start, items a previous process left processing are
pending again before /ready answers 200. Flags win over the environment variables named in
brackets. With OTEL_EXPORTER_OTLP_ENDPOINT (and the other standard OTEL_* variables) set, spans
of each event's intake, materialisation and delivery attempts are exported over OTLP
(docs/TRACING.md).`)
	streams := fs.String("streams", "sqlite", "stream `backend`: sqlite (the file under --db), nats://host:4222[,host2...][?replicas=3] or kafka://host:9092[,host2...][?replication_factor=3] or postgres://…[?schema=postbox] [POSTBOX_STREAMS]")
	store := fs.String("store", "sqlite", "delivery `store`: sqlite (the file under --db) or postgres://…[?schema=postbox], which several serve nodes share (then --streams must be nats://, kafka:// or postgres://) [POSTBOX_STORE]")
	node := fs.String("node", "", "this node's `name` in logs and in the leases of a shared store; defaults to the host name [POSTBOX_NODE]")
	addr := fs.String("addr", "", "listen `address` (host:port); overrides --port; without it and --port, 127.0.0.1:8000 [POSTBOX_ADDR]")
	port := positiveInt(8000)
	fs.Var(&port, "port", "listen `port` on every interface [PORT]")
	db := fs.String("db", server.DefaultDBPath, "SQLite database `file`: the streams with --streams sqlite, and always subscriptions, inboxes and their positions [DB_PATH]")
	sync := choice{value: "full", choices: []string{"full", "normal"}}
	fs.Var(&sync, "synchronous", "SQLite synchronous `mode`: full (an ACK survives power loss) or normal [POSTBOX_SYNCHRONOUS]")
	walCheckpoint := choice{value: "auto", choices: []string{"auto", "litestream"}}
	fs.Var(&walCheckpoint, "wal-checkpoint", "who checkpoints the SQLite write-ahead log, a `mode`: auto (postbox) or litestream (never postbox: Litestream, which replicates --db; docs/LITESTREAM.md) [POSTBOX_WAL_CHECKPOINT]")
	maxBatch := positiveInt(groupcommit.DefaultMaxBatch)
	fs.Var(&maxBatch, "max-batch", "most `events` written per group commit; 1 = one transaction per event [POSTBOX_MAX_BATCH]")
	queue := positiveInt(groupcommit.DefaultQueueSize)
	fs.Var(&queue, "queue-size", "bound of the writer queue in `events`; when full, ingress stops reading [QUEUE_MAXSIZE]")
	queueBytes := positiveInt(streamsqlite.DefaultQueueBytes)
	fs.Var(&queueBytes, "queue-bytes", "bound of the writer queue in payload `bytes` [POSTBOX_QUEUE_BYTES]")
	maxEnv := positiveInt(postbox.DefaultMaxEnvelopeBytes)
	fs.Var(&maxEnv, "max-envelope-bytes", "largest envelope accepted, in `bytes` [POSTBOX_MAX_ENVELOPE_BYTES]")
	whMax := positiveInt(server.DefaultWebhookMaxBytes)
	fs.Var(&whMax, "webhook-max-bytes", "largest webhook body accepted on POST /webhooks, in `bytes` [POSTBOX_WEBHOOK_MAX_BYTES]")
	whKeyHeader := fs.String("webhook-key-header", "", "another `header` holding a webhook's idempotency key, e.g. X-GitHub-Delivery [POSTBOX_WEBHOOK_KEY_HEADER]")
	whKeyField := fs.String("webhook-key-field", "", "a top-level JSON `field` holding it, e.g. id for Stripe [POSTBOX_WEBHOOK_KEY_FIELD]")
	whTypeHeader := fs.String("webhook-type-header", "", "another `header` holding a webhook's type, e.g. X-GitHub-Event [POSTBOX_WEBHOOK_TYPE_HEADER]")
	whTypeField := fs.String("webhook-type-field", "", "a top-level JSON `field` holding it, e.g. type for Stripe [POSTBOX_WEBHOOK_TYPE_FIELD]")
	whSecrets := fs.String("webhook-secret", "", "Standard Webhooks `secrets` (whsec_ and base64 of 16 to 128 bytes, comma-separated while rotating): POST /webhooks then requires a valid signature [POSTBOX_WEBHOOK_SECRET]")
	tokens := fs.String("auth-tokens", "", "file of 'TOKEN DEVICE_ID' lines; requires a bearer token on the ingress [POSTBOX_AUTH_TOKENS]")
	trustedProxies := fs.String("trusted-proxies", "", "`addresses` and CIDR prefixes of reverse proxies whose X-Forwarded-For names the client (in logs, webhook metadata and --ws-max-connections-per-address), comma-separated; from any other peer the header is ignored (docs/PROXY.md) [POSTBOX_TRUSTED_PROXIES]")
	tokenRate := eventRate(0)
	fs.Var(&tokenRate, "token-rate-limit", "`events` per second each device token (--auth-tokens) may send through the ingress, over every node of a shared store; a connection over it is not read until its budget refills (docs/PROTOCOL.md); 0 = no limit [POSTBOX_TOKEN_RATE_LIMIT]")
	tokenBurst := wholeNumber(0)
	fs.Var(&tokenBurst, "token-rate-burst", "`events` a device token may send at once after a quiet spell, with --token-rate-limit; 0 = one second's worth [POSTBOX_TOKEN_RATE_BURST]")
	apiToken := fs.String("api-token", "", "bearer `token` the operator API (subscriptions, streams, consumers, inboxes) and /metrics require [POSTBOX_API_TOKEN]")
	noAPIToken := fs.Bool("insecure-no-api-token", false, "serve the operator API without --api-token on an address beyond loopback; without this, serve refuses to start there [POSTBOX_INSECURE_NO_API_TOKEN]")
	allowedHosts := fs.String("allowed-hosts", "", "host `names` the operator API, console and /metrics answer under besides IP addresses, localhost and the --addr host, comma-separated (.example.com takes subdomains, * any); others get 421, which stops DNS rebinding [POSTBOX_ALLOWED_HOSTS]")
	allowedOrigins := fs.String("allowed-origins", "", "browser `origins` (https://ops.example.com) besides the server's own whose pages may change state through the operator API, comma-separated; others get 403 [POSTBOX_ALLOWED_ORIGINS]")
	readTimeout := positiveDuration(server.DefaultReadTimeout)
	fs.Var(&readTimeout, "http-read-timeout", "longest a request's body may take to arrive after its headers (`duration`) [POSTBOX_HTTP_READ_TIMEOUT]")
	idleTimeout := positiveDuration(server.DefaultIdleTimeout)
	fs.Var(&idleTimeout, "http-idle-timeout", "closes a keep-alive connection idle this long (`duration`) [POSTBOX_HTTP_IDLE_TIMEOUT]")
	maxHeader := positiveInt(server.DefaultMaxHeaderBytes)
	fs.Var(&maxHeader, "http-max-header-bytes", "largest request headers accepted, in `bytes`; larger get 431 [POSTBOX_HTTP_MAX_HEADER_BYTES]")
	maxConns := positiveInt(server.DefaultMaxConnections)
	fs.Var(&maxConns, "max-connections", "most open TCP `connections`, HTTP and WebSocket alike; more are closed at once [POSTBOX_MAX_CONNECTIONS]")
	wsMaxConns := positiveInt(ingress.DefaultMaxConnections)
	fs.Var(&wsMaxConns, "ws-max-connections", "most open ingress `connections`, WebSocket and gRPC streams together; more are refused (503 and Retry-After, gRPC RESOURCE_EXHAUSTED) [POSTBOX_WS_MAX_CONNECTIONS]")
	wsPerAddr := wholeNumber(ingress.DefaultMaxConnectionsPerAddress)
	fs.Var(&wsPerAddr, "ws-max-connections-per-address", "most open ingress `connections` without a device token from one client address (IPv4 address or IPv6 /64); more are refused like those over --ws-max-connections; 0 = no bound (behind a proxy every client has the proxy's address); with --auth-tokens each device holds one connection and is not counted [POSTBOX_WS_MAX_CONNECTIONS_PER_ADDRESS]")
	wsBuffer := positiveInt(ingress.DefaultMaxBufferedBytes)
	fs.Var(&wsBuffer, "ws-buffer-bytes", "memory for ingress frames being read and envelopes not yet stored (queued for the writer included), over all connections, in `bytes`; at least the 16 MiB frame limit [POSTBOX_WS_BUFFER_BYTES]")
	sourceBuffer := positiveInt(server.DefaultSourceBufferBytes)
	fs.Var(&sourceBuffer, "source-buffer-bytes", "memory for poll answers and feed lines being read and their events waiting to be stored, over all poll and feed sources, in `bytes`; one answer or line is at most half of it [POSTBOX_SOURCE_BUFFER_BYTES]")
	wsFrameTimeout := positiveDuration(ingress.DefaultFrameTimeout)
	fs.Var(&wsFrameTimeout, "ws-frame-timeout", "longest an ingress frame's body may take to arrive after its header (`duration`); the connection is then closed [POSTBOX_WS_FRAME_TIMEOUT]")
	memLimit := memoryLimit{}
	fs.Var(&memLimit, "memory-limit", "soft memory `limit` of the Go runtime, as GOMEMLIMIT: bytes with an optional unit (B, KiB, MiB, GiB, TiB), or off; the collector works harder near it. Default: --ws-buffer-bytes + --queue-bytes + --source-buffer-bytes + 32 MiB (288 MiB) [POSTBOX_MEMORY_LIMIT, GOMEMLIMIT]")
	grpcAddr := fs.String("grpc-addr", "", "listen `address` (host:port) of the gRPC ingress, TLS with --tls-cert; off without it [POSTBOX_GRPC_ADDR]")
	cert := fs.String("tls-cert", "", "TLS certificate file (PEM); serves HTTPS/WSS (and gRPC over TLS) with --tls-key [POSTBOX_TLS_CERT]")
	key := fs.String("tls-key", "", "TLS private key file (PEM) [POSTBOX_TLS_KEY]")
	workers := positiveInt(delivery.DefaultWorkers)
	fs.Var(&workers, "workers", "`items` the workers handle at once, over every inbox with a target or handler [WORKER_COUNT]")
	maxAttempts := positiveInt(delivery.DefaultMaxAttempts)
	fs.Var(&maxAttempts, "max-attempts", "`attempts` an item gets before it is failed, a dead letter [MAX_ATTEMPTS]")
	retryBase := positiveDuration(delivery.DefaultRetryBaseDelay)
	fs.Var(&retryBase, "retry-base-delay", "wait before the first retry; each later one doubles it (`duration`, e.g. 5s, 300ms) [RETRY_BASE_DELAY]")
	retryMax := positiveDuration(delivery.DefaultRetryMaxDelay)
	fs.Var(&retryMax, "retry-max-delay", "longest wait between retries (`duration`) [RETRY_MAX_DELAY]")
	jitter := choice{value: retry.FullJitter.String(), choices: []string{retry.FullJitter.String(), retry.EqualJitter.String(), retry.NoJitter.String()}}
	fs.Var(&jitter, "retry-jitter", "`mode` of the random part of each retry wait: full (anywhere up to it), equal (at least half of it) or none [POSTBOX_RETRY_JITTER]")
	handlerTimeout := positiveDuration(delivery.DefaultHandlerTimeout)
	fs.Var(&handlerTimeout, "handler-timeout", "longest one attempt may take, e.g. a POST to a target (`duration`) [POSTBOX_HANDLER_TIMEOUT]")
	retention := wholeNumber(30)
	fs.Var(&retention, "retention-days", "`days` completed and failed items, and stream events every consumer has read, are kept; 0 keeps them [RETENTION_DAYS]")
	cleanup := hours(delivery.DefaultCleanupInterval)
	fs.Var(&cleanup, "cleanup-interval-hours", "how often retention runs, in `hours` (or a duration such as 30m) [CLEANUP_INTERVAL_HOURS]")
	var whTarget httpURL
	fs.Var(&whTarget, "webhook-target", "`URL` the workers POST each webhook to (the default subscription webhooks); without one, runtimes lease the inbox webhooks [WEBHOOK_TARGET_URL]")
	allowLinkLocal := fs.Bool("allow-link-local-targets", false, "let targets be link-local addresses (169.254.0.0/16 with the cloud metadata address 169.254.169.254, fe80::/10), refused by default [POSTBOX_ALLOW_LINK_LOCAL_TARGETS]")
	denyPrivate := fs.Bool("deny-private-targets", false, "refuse targets at loopback, private, CGNAT and reserved addresses too, checked when connecting, when whoever sets a target is not trusted [POSTBOX_DENY_PRIVATE_TARGETS]")
	level := choice{value: "info", choices: []string{"debug", "info", "warn", "error"}}
	fs.Var(&level, "log-level", "`level`: debug, info, warn or error [LOG_LEVEL]")
	format := choice{value: "pretty", choices: []string{"pretty", "json", "text"}}
	fs.Var(&format, "log-format", "`format`: json or pretty [LOG_FORMAT]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if retryBase > retryMax {
		return usagef("the retry base delay %v (--retry-base-delay, RETRY_BASE_DELAY) is above the retry max delay %v (--retry-max-delay, RETRY_MAX_DELAY)",
			time.Duration(retryBase), time.Duration(retryMax))
	}
	if tokenRate == 0 && isSet(fs, "token-rate-burst") {
		return usagef("--token-rate-burst (POSTBOX_TOKEN_RATE_BURST) goes with --token-rate-limit (POSTBOX_TOKEN_RATE_LIMIT): set the rate too")
	}
	if tokenRate > 0 && *tokens == "" {
		return usagef("--token-rate-limit (POSTBOX_TOKEN_RATE_LIMIT) limits each device token: it needs --auth-tokens (POSTBOX_AUTH_TOKENS)")
	}
	proxies, err := forwarded.ParseProxies(splitList(*trustedProxies))
	if err != nil {
		return usagef("--trusted-proxies (POSTBOX_TRUSTED_PROXIES): %v", err)
	}
	rate := intakerate.Rate{PerSecond: float64(tokenRate), Burst: int(tokenBurst)}
	if tokenRate > 0 {
		if err := rate.Validate("token rate"); err != nil {
			return usagef("--token-rate-limit/--token-rate-burst: %v", strings.TrimPrefix(err.Error(), "token rate."))
		}
	}
	log, err := newLogger(env.stderr, level.value, format.value)
	if err != nil {
		return err
	}
	setMemoryLimit(log, fs, memLimit, int64(wsBuffer)+int64(queueBytes)+int64(sourceBuffer)+memoryLimitBase)
	stopTracing, err := startTracing(ctx, env, "postbox-serve", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	if *addr == "" {
		// Loopback unless a port is asked for: beyond loopback the
		// operator API wants a token, and a first run has none.
		*addr = fmt.Sprintf("127.0.0.1:%d", port)
		if isSet(fs, "port") {
			*addr = fmt.Sprintf(":%d", port)
		}
	}
	keep := time.Duration(retention) * 24 * time.Hour
	if retention == 0 {
		keep = -1
	}
	// serve wires internal/server, not the public server package: that
	// package documents its defaults as constants of its own, which a test
	// (server/config_internal_test.go) pins to the internal ones whoever
	// calls it, and it lacks what serve needs of the internal one: the
	// store's logger, and the ConfigError that lets serve name its flags.
	cfg := server.Config{
		Addr:               *addr,
		GRPCAddr:           *grpcAddr,
		DBPath:             *db,
		Synchronous:        strings.ToUpper(sync.value),
		WALCheckpoint:      walCheckpoint.value,
		MaxBatch:           int(maxBatch),
		QueueSize:          int(queue),
		QueueBytes:         int(queueBytes),
		Limits:             postbox.Limits{MaxEnvelopeBytes: int(maxEnv)},
		TLSCert:            *cert,
		TLSKey:             *key,
		APIToken:           *apiToken,
		InsecureNoAPIToken: *noAPIToken,
		AllowedHosts:       splitList(*allowedHosts),
		AllowedOrigins:     splitList(*allowedOrigins),
		ReadTimeout:        time.Duration(readTimeout),
		IdleTimeout:        time.Duration(idleTimeout),
		MaxHeaderBytes:     int(maxHeader),
		MaxConnections:     int(maxConns),
		WSMaxConnections:   int(wsMaxConns),
		WSBufferBytes:      int64(wsBuffer),
		WSFrameTimeout:     time.Duration(wsFrameTimeout),
		SourceBufferBytes:  int64(sourceBuffer),
		// 0 (no bound) is -1 to the ingress, whose zero is its default.
		WSMaxConnectionsPerAddress: cmp.Or(int(wsPerAddr), -1),
		Webhooks: server.WebhookConfig{MaxBytes: int64(whMax), KeyHeader: *whKeyHeader, KeyField: *whKeyField,
			TypeHeader: *whTypeHeader, TypeField: *whTypeField, Secrets: splitList(*whSecrets), Target: string(whTarget)},
		Delivery: delivery.Config{Workers: int(workers), MaxAttempts: int(maxAttempts), RetryBaseDelay: time.Duration(retryBase),
			RetryMaxDelay: time.Duration(retryMax), Jitter: mustJitter(jitter.value), HandlerTimeout: time.Duration(handlerTimeout), Retention: keep,
			CleanupInterval: time.Duration(cleanup), AllowLinkLocalTargets: *allowLinkLocal, DenyPrivateTargets: *denyPrivate,
			Node: *node},
		TokenRateLimit: rate,
		TrustedProxies: proxies,
		Logger:         log,
	}
	if *tokens != "" {
		if cfg.Tokens, err = readTokens(*tokens); err != nil {
			return err
		}
	}
	closeBackends, err := openBackends(&cfg, *streams, *store, log)
	if err != nil {
		return err
	}
	srv, err := server.New(cfg)
	if err != nil {
		closeBackends()
		return flagNamed(err)
	}
	return flagNamed(srv.Run(ctx)) // closes the backends when it returns
}

// configFlags names the Config fields of the server's errors as the
// flags (and variables) of serve that set them.
var configFlags = strings.NewReplacer(
	"Config.Webhooks.Secrets", "--webhook-secret (POSTBOX_WEBHOOK_SECRET)",
	"Config.InsecureNoAPIToken", "--insecure-no-api-token (POSTBOX_INSECURE_NO_API_TOKEN=true)",
	"Config.APIToken", "--api-token TOKEN (POSTBOX_API_TOKEN)",
	"Config.AllowedHosts", "--allowed-hosts (POSTBOX_ALLOWED_HOSTS)",
	"Config.AllowedOrigins", "--allowed-origins (POSTBOX_ALLOWED_ORIGINS)",
	"Config.TLSCert", "--tls-cert",
	"Config.TLSKey", "--tls-key",
	"Config.Addr", "--addr",
)

// flagNamed rewrites a server.ConfigError to name serve's flags instead
// of the Config fields they set; other errors are returned as they are.
func flagNamed(err error) error {
	if ce, ok := errors.AsType[*server.ConfigError](err); ok {
		return errors.New(configFlags.Replace(ce.Msg))
	}
	return err
}

// openBackends opens the stream backend that spec (--streams) names and
// the delivery store that storeSpec (--store) names, and sets cfg.Streams
// and cfg.Store. With sqlite for both, the SQLite file at cfg.DBPath is
// both (one writer, as postbox has always run); with another stream
// backend, the file holds delivery state alone; with a postgres store,
// the nodes sharing it need a stream backend they share too. It returns a
// function that closes what it opened, for when the server does not run.
func openBackends(cfg *server.Config, spec, storeSpec string, log *slog.Logger) (closeAll func(), err error) {
	kind, err := streamsKind(spec)
	if err != nil {
		return nil, err
	}
	shared, err := storeKind(storeSpec)
	if err != nil {
		return nil, err
	}
	if shared && kind == "sqlite" {
		return nil, usagef("--store %s (POSTBOX_STORE) is shared by several nodes, but --streams sqlite is a file of this node alone: "+
			"use --streams nats://…, kafka://… or postgres://… with it", redactURL(storeSpec))
	}
	if err := refuseNewer(context.Background(), cfg.DBPath, spec, storeSpec); err != nil {
		return nil, err
	}
	if kind == "sqlite" {
		db, err := server.OpenSQLite(*cfg)
		if err != nil {
			return nil, err
		}
		cfg.Streams, cfg.Store = db, db
		log.Info("postbox serve: streams and store", "streams", "sqlite", "store", "sqlite", "db", cfg.DBPath)
		return func() { db.Close() }, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams, where, err := openStreams(ctx, kind, spec, kafkaIndex(cfg.DBPath, storeSpec, shared))
	if err != nil {
		return nil, err
	}
	var store interface {
		delivery.Store
		Close() error
	}
	if shared {
		u, schema, err := splitSchema(storeSpec, "--store (POSTBOX_STORE)")
		if err != nil {
			streams.Close()
			return nil, err
		}
		pg, err := deliverypg.Open(ctx, deliverypg.Config{URL: u, Schema: schema, Logger: log})
		if err != nil {
			streams.Close()
			return nil, fmt.Errorf("--store %s: %w", redactURL(storeSpec), err)
		}
		store = pg
		where = append(where, "store", "postgres", "store_database", redactURL(u), "store_schema", pg.Schema(), "node", cfg.Delivery.Node)
	} else {
		db, err := server.OpenSQLite(*cfg)
		if err != nil {
			streams.Close()
			return nil, err
		}
		store = db
		where = append(where, "store", "sqlite", "db", cfg.DBPath)
	}
	cfg.Streams, cfg.Store = streams, store
	log.Info("postbox serve: streams and store", append([]any{"streams", kind}, where...)...)
	return func() { streams.Close(); store.Close() }, nil
}

// storeKind reports whether a --store value names a shared PostgreSQL
// store (else the SQLite file), or returns a usage error naming the
// accepted forms.
func storeKind(spec string) (shared bool, _ error) {
	if strings.EqualFold(spec, "sqlite") || spec == "" {
		return false, nil
	}
	if u, err := url.Parse(spec); err == nil && (strings.EqualFold(u.Scheme, "postgres") || strings.EqualFold(u.Scheme, "postgresql")) {
		return true, nil
	}
	return false, usagef("--store %q (POSTBOX_STORE): use sqlite (the SQLite file under --db) or postgres://user@host:5432/db[?schema=postbox]",
		redactURL(spec))
}

// splitSchema takes postbox's ?schema= option out of a PostgreSQL URL.
func splitSchema(spec, flag string) (pgURL, schema string, _ error) {
	u, err := url.Parse(spec)
	if err != nil {
		return "", "", usagef("%s: %v", flag, err)
	}
	q := u.Query()
	schema = q.Get("schema")
	q.Del("schema") // postbox's option, not a PostgreSQL parameter
	u.RawQuery = q.Encode()
	return u.String(), schema, nil
}

// openStreams opens a stream backend other than sqlite: JetStream (nats)
// from spec with its options, Kafka (kafka) with its identity index where
// spec's index= says or else at defaultIndex, or PostgreSQL (postgres) in
// the schema of ?schema= (default postbox). It returns the backend and,
// for the log, where it is, passwords hidden.
func openStreams(ctx context.Context, kind, spec, defaultIndex string) (stream.Backend, []any, error) {
	switch kind {
	case "kafka":
		kcfg, err := parseKafkaStreams(spec, defaultIndex)
		if err != nil {
			return nil, nil, err
		}
		kb, err := streamkafka.Open(ctx, kcfg)
		if err != nil {
			return nil, nil, fmt.Errorf("--streams %s: %w", redactURL(spec), err)
		}
		return kb, []any{"brokers", strings.Join(kcfg.Brokers, ","), "prefix", cmp.Or(kcfg.Prefix, streamkafka.DefaultPrefix), "index", redactURL(kcfg.Index)}, nil
	case "nats":
		ncfg, err := streamnats.ParseURL(spec)
		if err != nil {
			return nil, nil, usagef("--streams (POSTBOX_STREAMS): %v", err)
		}
		js, err := streamnats.Open(ctx, ncfg)
		if err != nil {
			return nil, nil, fmt.Errorf("--streams %s: %w", redactURL(spec), err)
		}
		return js, []any{"servers", redactURL(ncfg.URL), "replicas", max(ncfg.Replicas, 1)}, nil
	}
	u, schema, err := splitSchema(spec, "--streams (POSTBOX_STREAMS)")
	if err != nil {
		return nil, nil, err
	}
	pg, err := streampg.Open(ctx, streampg.Config{URL: u, Schema: schema})
	if err != nil {
		return nil, nil, fmt.Errorf("--streams %s: %w", redactURL(spec), err)
	}
	return pg, []any{"database", redactURL(u), "schema", cmp.Or(schema, streampg.DefaultSchema)}, nil
}

// streamsKind returns which backend a --streams value names: sqlite, nats
// or postgres, or a usage error naming the accepted forms.
func streamsKind(spec string) (string, error) {
	if strings.EqualFold(spec, "sqlite") || spec == "" {
		return "sqlite", nil
	}
	if u, err := url.Parse(spec); err == nil && (strings.EqualFold(u.Scheme, "nats") || strings.EqualFold(u.Scheme, "tls")) && u.Host != "" {
		return "nats", nil
	}
	if u, err := url.Parse(spec); err == nil && (strings.EqualFold(u.Scheme, "postgres") || strings.EqualFold(u.Scheme, "postgresql")) {
		return "postgres", nil
	}
	if u, err := url.Parse(spec); err == nil && strings.EqualFold(u.Scheme, "kafka") && u.Host != "" {
		return "kafka", nil
	}
	return "", usagef("--streams %q (POSTBOX_STREAMS): use sqlite (the SQLite file under --db), nats://host:4222[,host2:4222...][?replicas=3], "+
		"kafka://host:9092[,host2:9092...][?replication_factor=3] or postgres://user@host:5432/db[?schema=postbox]",
		redactURL(spec))
}

// kafkaStreamsOptions are the query options of a kafka:// --streams URL
// besides kafkaopt's TLS and SASL ones.
var kafkaStreamsOptions = []string{"prefix", "replication_factor", "client_id", "max_bytes", "claim_timeout", "index", "index_schema"}

// parseKafkaStreams reads a --streams kafka://HOST:9092[,HOST:9092]?…
// URL into a streamkafka.Config; the identity index is at index= or else
// at defaultIndex. Its usage errors name the option at fault and never
// the password.
func parseKafkaStreams(spec, defaultIndex string) (streamkafka.Config, error) {
	var cfg streamkafka.Config
	shown := redactURL(spec)
	u, err := url.Parse(spec)
	if err != nil {
		return cfg, usagef("--streams (POSTBOX_STREAMS): %v", err)
	}
	q := u.Query()
	known := append(slices.Clone(kafkaStreamsOptions), kafkaopt.Names...)
	for k := range q {
		if !slices.Contains(known, k) {
			return cfg, usagef("--streams %s: unknown option %q (%s)", shown, k, strings.Join(known, ", "))
		}
	}
	if cfg.Brokers, err = kafkaopt.Brokers(u.Host); err != nil {
		return cfg, usagef("--streams %s: %v", shown, err)
	}
	if cfg.Options, err = kafkaopt.Options(u, q); err != nil {
		return cfg, usagef("--streams: %v", err)
	}
	cfg.Prefix, cfg.ClientID = q.Get("prefix"), q.Get("client_id")
	cfg.Index, cfg.IndexSchema = cmp.Or(q.Get("index"), defaultIndex), q.Get("index_schema")
	if v := q.Get("replication_factor"); v != "" {
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil || (n < 1 && n != -1) {
			return cfg, usagef("--streams: replication_factor=%q: use a whole number of replicas, e.g. 3 (or -1 for the brokers' default)", v)
		}
		cfg.ReplicationFactor = int16(n)
	}
	if v := q.Get("max_bytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return cfg, usagef("--streams: max_bytes=%q is not a positive whole number", v)
		}
		cfg.MaxRecordBytes = n
	}
	if v := q.Get("claim_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, usagef("--streams: claim_timeout=%q is not a positive duration such as 10s", v)
		}
		cfg.ClaimTimeout = d
	}
	if strings.HasPrefix(cfg.Index, "postgres://") || strings.HasPrefix(cfg.Index, "postgresql://") {
		pgURL, schema, err := splitSchema(cfg.Index, "--streams index=")
		if err != nil {
			return cfg, err
		}
		cfg.Index, cfg.IndexSchema = pgURL, cmp.Or(cfg.IndexSchema, schema)
	}
	return cfg, nil
}

// kafkaIndex is where Kafka streams keep their identity index unless the
// --streams URL says: in the shared PostgreSQL store of a cluster, or else
// in a SQLite file beside the database file dbPath.
func kafkaIndex(dbPath, storeSpec string, shared bool) string {
	if shared {
		return storeSpec
	}
	return strings.TrimSuffix(dbPath, filepath.Ext(dbPath)) + "-kafka-index.db"
}

// redactURL hides the password of a URL for messages.
func redactURL(spec string) string {
	if u, err := url.Parse(spec); err == nil && u.User != nil {
		return u.Redacted()
	}
	return spec
}

// readTokens reads a tokens file: one "TOKEN DEVICE_ID" per line; blank
// lines and lines starting with # are skipped.
func readTokens(path string) (ingress.Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth tokens: %w", err)
	}
	defer f.Close()
	tokens := ingress.Tokens{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("auth tokens %s:%d: want 'TOKEN DEVICE_ID', got %d fields", path, n, len(fields))
		}
		tokens.Add(fields[0], fields[1])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("auth tokens %s: %w", path, err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("auth tokens %s: no tokens in the file", path)
	}
	return tokens, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// positiveDuration is a flag.Value for a duration > 0: Go syntax (5s,
// 300ms, 2m30s) or a bare number of seconds.
type positiveDuration time.Duration

func (p *positiveDuration) String() string { return time.Duration(*p).String() }
func (p *positiveDuration) Set(s string) error {
	return (&duration{(*time.Duration)(p), 1}).Set(s)
}

// duration is a flag.Value for a duration of at least min: Go syntax
// (5s, 300ms, 2m30s) or a bare number of seconds, as every duration
// flag takes.
type duration struct {
	d   *time.Duration
	min time.Duration
}

// durationVar defines a duration flag of at least min and returns where
// its value goes. --help shows its argument as a duration.
func durationVar(fs *flag.FlagSet, name string, value, min time.Duration, usage string) *time.Duration {
	d := value
	if !strings.Contains(usage, "`") {
		usage += " (`duration`)"
	}
	fs.Var(&duration{&d, min}, name, usage)
	return &d
}

func (v *duration) String() string {
	if v.d == nil {
		return "0s"
	}
	return v.d.String()
}

func (v *duration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		d, err = time.Duration(n*float64(time.Second)), nil
	}
	switch {
	case err != nil:
		return fmt.Errorf("%q is not a duration: use Go syntax such as 5s, 300ms or 2m, or seconds", s)
	case d < v.min && v.min == 1:
		return fmt.Errorf("%q is not a positive duration", s)
	case d < v.min:
		return fmt.Errorf("%q is under %v", s, v.min)
	}
	*v.d = d
	return nil
}

// hours is a flag.Value for a positive number of hours (1, 0.5) or a
// duration (30m).
type hours time.Duration

func (h *hours) String() string { return strconv.FormatFloat(time.Duration(*h).Hours(), 'f', -1, 64) }
func (h *hours) Set(s string) error {
	d, ok := parseDuration(s, time.Hour)
	if !ok {
		return fmt.Errorf("%q is not a positive number of hours (or a duration such as 30m)", s)
	}
	*h = hours(d)
	return nil
}

// parseDuration reads a duration > 0 in Go syntax, or a bare number of
// unit.
func parseDuration(s string, unit time.Duration) (time.Duration, bool) {
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(n * float64(unit)), n > 0
	}
	d, err := time.ParseDuration(s)
	return d, err == nil && d > 0
}

// eventRate is a flag.Value for events per second: a number >= 0 (0:
// no limit), at most intakerate.MaxPerSecond.
type eventRate float64

func (e *eventRate) String() string { return strconv.FormatFloat(float64(*e), 'f', -1, 64) }
func (e *eventRate) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSuffix(s, "/s"), 64)
	if err != nil || f < 0 || f > intakerate.MaxPerSecond || f != f {
		return fmt.Errorf("%q is not a rate: events per second from 0 (no limit) to %d, e.g. 100 or 0.5", s, intakerate.MaxPerSecond)
	}
	*e = eventRate(f)
	return nil
}

// wholeNumber is a flag.Value for an int >= 0.
type wholeNumber int

func (w *wholeNumber) String() string { return strconv.Itoa(int(*w)) }
func (w *wholeNumber) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a whole number (0 or more)", s)
	}
	*w = wholeNumber(n)
	return nil
}

// choice is a flag.Value for one of a few words, in any case.
type choice struct {
	value   string
	choices []string
}

func (c *choice) String() string { return c.value }
func (c *choice) Set(s string) error {
	if !slices.Contains(c.choices, strings.ToLower(s)) {
		return fmt.Errorf("%q: use %s", s, strings.Join(c.choices, ", "))
	}
	c.value = strings.ToLower(s)
	return nil
}

// mustJitter is the retry.Jitter a --retry-jitter choice names.
func mustJitter(s string) retry.Jitter {
	j, err := retry.ParseJitter(s)
	if err != nil {
		panic(err) // the choice allows only the names of modes
	}
	return j
}

// httpURL is a flag.Value for an http:// or https:// URL.
type httpURL string

func (h *httpURL) String() string { return string(*h) }
func (h *httpURL) Set(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http:// or https:// URL", s)
	}
	*h = httpURL(s)
	return nil
}
