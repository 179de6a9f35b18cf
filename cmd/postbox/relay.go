package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/kafkaopt"
	"github.com/postbox-events/postbox/internal/relaymetrics"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
	"github.com/postbox-events/postbox/outbox/outboxnats"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxredis"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/retry"
)

// Defaults of postbox relay.
const (
	defaultRelayMaxAttempts = 20
	defaultRelayListen      = "127.0.0.1:9465"
)

func runRelay(ctx context.Context, env *cmdEnv, args []string) error {
	fs := newFlags(env, "relay", "--db DSN --to URL [flags]", `Relays a transactional outbox to a receiver: takes undelivered rows in order (FOR UPDATE SKIP
LOCKED, so several relays can share one outbox), publishes them, marks each delivered after the
receiver's ACK, retries failures with backoff and parks a row that keeps failing (list and requeue
it with postbox outbox). Wakes on LISTEN/NOTIFY and polls as well.

--db    postgres://USER@HOST:5432/DB (the outbox table is created if missing), or the path of a
        SQLite file written with outboxsqlite.Insert or by postbox agent; every target but a
        postbox server gets each event's payload, with its other fields beside it
--to    redis://HOST:6379/0?stream=NAME[&maxlen=N][&idmp=auto|off|on&producer=ID]   (XADD)
        nats://HOST:4222?stream=NAME[&subject=PREFIX][&create=false]          (JetStream, Nats-Msg-Id)
        kafka://HOST:9092[,HOST:9092...]?topic=NAME[&key=correlation_id|tenant_id|event_id]
                [&client_id=ID][&max_bytes=N][&tls=1&tls_ca=FILE&tls_cert=FILE&tls_key=FILE]
                [&sasl_mechanism=plain|scram-sha-256|scram-sha-512, with USER:PASS@]
                                                                      (idempotent producer, acks=all)
        ws://HOST:PORT or wss://HOST:PORT                                     (a postbox server)

To a postbox server the events go to its device source devices, unless --source names another
device source (postbox sources create NAME --kind device): each service relaying under its own
source, its events are kept in their own stream and subscribed to by origin.

Each event's W3C trace context (traceparent) is sent with it; with OTEL_EXPORTER_OTLP_ENDPOINT
set, each publish is a span exported over OTLP (docs/TRACING.md).`)
	dsn := fs.String("db", "", "the outbox's database: postgres://... or a SQLite file [DATABASE_URL]")
	to := fs.String("to", "", "where to relay: redis://, nats://, kafka://, ws:// or wss:// URL [POSTBOX_RELAY_TO]")
	listen := fs.String("listen", defaultRelayListen, "address of /metrics and /healthz; empty: none [POSTBOX_RELAY_LISTEN]")
	token := fs.String("token", "", "bearer token for a ws:// target [POSTBOX_TOKEN]")
	source := fs.String("source", "", "for a ws:// or wss:// target: the server's device `source` the events go to (default: devices)")
	migrate := fs.Bool("migrate", true, "create or upgrade the outbox table at start (false: refuse to start without it)")
	batch := positiveInt(1000)
	fs.Var(&batch, "batch", "most `events` per publish")
	window := positiveInt(8000)
	fs.Var(&window, "max-in-flight", "most `events` published and not yet answered (set it to --batch to keep order)")
	maxAttempts := positiveInt(defaultRelayMaxAttempts)
	fs.Var(&maxAttempts, "max-attempts", "`refusals` after which a row is parked as rejected")
	poll := positiveDuration(outbox.DefaultPollInterval)
	fs.Var(&poll, "poll", "poll `interval`, besides LISTEN/NOTIFY")
	claim := positiveDuration(outboxpg.DefaultClaim)
	fs.Var(&claim, "claim", "how long a relay's claim on the rows it sends lasts unless extended; a live relay extends its claims every quarter of it, a dead relay's rows are sent again after it")
	retryMax := positiveDuration(outbox.DefaultRetryMax)
	fs.Var(&retryMax, "retry-max", "cap of the backoff before resending a refused row")
	retention := durationVar(fs, "retention", outboxpg.DefaultRetention, math.MinInt64, "delete delivered rows older than this; negative: keep them")
	ackTimeout := positiveDuration(10 * time.Second)
	fs.Var(&ackTimeout, "ack-timeout", "how long to wait for a publish's replies (less than --claim)")
	progress := durationVar(fs, "progress", 10*time.Second, 0, "how often to log progress while relaying; 0: never")
	level := fs.String("log-level", "info", "debug, info, warn or error [LOG_LEVEL]")
	format := fs.String("log-format", "pretty", "json or pretty [LOG_FORMAT]")
	if err := parse(env, fs, args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *dsn == "" || *to == "" {
		return usagef("relay: --db and --to are required")
	}
	if claim <= ackTimeout {
		return usagef("relay: --claim (%s) must be longer than --ack-timeout (%s), or another relay may take rows still being sent", &claim, &ackTimeout)
	}
	if window < batch {
		return usagef("relay: --max-in-flight (%d) must be at least --batch (%d)", window, batch)
	}
	log, err := newLogger(env.stderr, *level, *format)
	if err != nil {
		return err
	}
	stopTracing, err := startTracing(ctx, env, "postbox-relay", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	redis.SetLogger(redisLogger{log})
	// --listen before anything else, so that a port in use stops the relay
	// before it claims rows.
	var ln net.Listener
	if *listen != "" {
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fmt.Errorf("relay: --listen %s: %w", *listen, err)
		}
		defer ln.Close()
	}
	// The target first: a mistake in --to is a usage error, found before
	// the outbox database is touched (and its table created).
	if *source != "" && !strings.HasPrefix(*to, "ws://") && !strings.HasPrefix(*to, "wss://") {
		return usagef("relay: --source names a postbox server's source: it goes with a ws:// or wss:// --to")
	}
	pub, closePub, err := relayTarget(ctx, *to, wsOptions{token: *token, source: *source}, time.Duration(ackTimeout), log)
	if err != nil {
		return err
	}
	defer closePub()
	// One relay sends a SQLite outbox: it keeps the rows in flight in
	// memory, where PostgreSQL's relays claim theirs in the table. The
	// lock comes before the store opens the file (sqlitedb.Lock); a file
	// that is not there is openOutboxDB's to name, not created by it.
	var lock *sqlitedb.FileLock
	if fi, err := os.Stat(*dsn); err == nil && fi.Mode().IsRegular() && !isPostgres(*dsn) {
		if lock, err = sqlitedb.Lock(*dsn); err != nil {
			return fmt.Errorf("relay: outbox %w", err)
		}
	}
	src, err := openOutboxDB(ctx, *dsn, *migrate, outboxpg.Config{Claim: time.Duration(claim), Retention: *retention, Logger: log})
	if err != nil {
		lock.Unlock()
		return err
	}
	src.lock = lock // src.close releases it after the store is closed
	defer src.close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := relaymetrics.Register(reg, src.admin)
	var delivered, failed atomic.Int64
	relay, err := outbox.NewRelay(src.store, pub, outbox.RelayConfig{
		BatchSize: int(batch), MaxInFlight: int(window), PollInterval: time.Duration(poll), MaxAttempts: int(maxAttempts),
		Retry:  retry.Backoff{Base: outbox.DefaultRetryBase, Max: time.Duration(retryMax)},
		Logger: log,
		Observe: func(st outbox.Stats) {
			m.Observe(st)
			delivered.Add(int64(st.Delivered))
			failed.Add(int64(st.Rejected + st.Retried + st.Unanswered))
		},
	})
	if err != nil {
		return err
	}
	log.Info("relay: started", "db", redact(*dsn), "to", redact(*to), "batch", int(batch), "max_in_flight", int(window), "max_attempts", int(maxAttempts))

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return relay.Run(ctx) })
	g.Go(func() error { return src.run(ctx) })
	if ln != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		log.Info("relay: metrics on http://" + ln.Addr().String() + "/metrics")
		g.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	if *progress > 0 {
		g.Go(func() error {
			reportProgress(ctx, log, *progress, src.admin, &delivered, &failed)
			return nil
		})
	}
	err = g.Wait()
	log.Info("relay: stopped", "delivered", delivered.Load())
	return err
}

// reportProgress logs what the relay did every interval in which it did
// something, with the backlog.
func reportProgress(ctx context.Context, log *slog.Logger, every time.Duration, store relaymetrics.Outbox, delivered, failed *atomic.Int64) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastDelivered, lastFailed int64
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d, f := delivered.Load(), failed.Load()
			if d == lastDelivered && f == lastFailed {
				continue
			}
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			pending, rejected, err := store.Counts(qctx)
			oldest, ok, _ := store.OldestPending(qctx)
			cancel()
			rate := float64(d-lastDelivered) / now.Sub(last).Seconds()
			attrs := []any{"delivered", d, "rate_per_s", math.Round(rate*10) / 10, "failed_events", f - lastFailed}
			if err == nil {
				attrs = append(attrs, "backlog", pending, "rejected", rejected)
			}
			if ok {
				attrs = append(attrs, "oldest_pending_age", time.Since(oldest).Round(time.Millisecond))
			}
			log.Info("relay: progress", attrs...)
			lastDelivered, lastFailed, last = d, f, now
		}
	}
}

// outboxDB is an opened outbox database: a transactional outbox in
// PostgreSQL, or an outbox in a SQLite file.
type outboxDB struct {
	store outbox.Store
	admin outbox.Admin
	pool  *pgxpool.Pool // PostgreSQL only
	pg    *outboxpg.Store
	lite  *outboxsqlite.Store // SQLite only
	lock  *sqlitedb.FileLock  // a relay's, of a SQLite outbox
}

func isPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// checkDB refuses a --db that looks like a URL but is not PostgreSQL's,
// rather than taking it for the path of a SQLite file.
func checkDB(dsn string) error {
	if strings.Contains(dsn, "://") && !isPostgres(dsn) {
		return usagef("--db %s: a PostgreSQL outbox is a postgres:// or postgresql:// URL; anything else is the path of a SQLite file", redact(dsn))
	}
	return nil
}

// openOutboxDB opens the outbox at dsn. With migrate, a missing
// PostgreSQL table is created; without, its absence is an error saying how
// to create it.
func openOutboxDB(ctx context.Context, dsn string, migrate bool, cfg outboxpg.Config) (*outboxDB, error) {
	if err := checkDB(dsn); err != nil {
		return nil, err
	}
	if !isPostgres(dsn) {
		if _, err := os.Stat(dsn); err != nil {
			return nil, fmt.Errorf("outbox %s: %w (PostgreSQL outboxes are postgres:// URLs)", dsn, err)
		}
		if !migrate {
			ok, err := outboxsqlite.Exists(dsn)
			if err != nil {
				return nil, fmt.Errorf("outbox %s: not a SQLite database: %w", dsn, err)
			}
			if !ok {
				return nil, fmt.Errorf("outbox %s: no outbox in this file (an agent's --outbox file, or a database an outbox was created in)", dsn)
			}
		}
		s, err := outboxsqlite.Open(dsn, outboxsqlite.Config{})
		if err != nil {
			return nil, fmt.Errorf("outbox %s: %w", dsn, err)
		}
		return &outboxDB{store: s, admin: s, lite: s}, nil
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("--db: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("--db %s: %w", redact(dsn), err)
	}
	if migrate {
		err = outboxpg.Migrate(pctx, pool)
	} else if ok, e := outboxpg.Exists(pctx, pool); e != nil {
		err = e
	} else if !ok {
		err = fmt.Errorf("no outbox table in %s; create it with: postbox outbox migrate --db '%s'", redact(dsn), redact(dsn))
	} else {
		err = refuseNewerOutbox(pctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	s, err := outboxpg.New(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &outboxDB{store: s, admin: s, pool: pool, pg: s}, nil
}

// run runs the store's own loops: LISTEN and retention for PostgreSQL, the
// insert writer for SQLite.
func (o *outboxDB) run(ctx context.Context) error {
	if o.pg != nil {
		return o.pg.Run(ctx)
	}
	return o.lite.Run(ctx)
}

func (o *outboxDB) close() {
	if o.pool != nil {
		o.pool.Close()
	}
	if o.lite != nil {
		o.lite.Close()
	}
	o.lock.Unlock()
}

// relayTarget returns the publisher for a --to URL and a function that
// closes its connection. The publishers log to log.
func relayTarget(ctx context.Context, to string, ws wsOptions, ackTimeout time.Duration, log *slog.Logger) (outbox.Publisher, func(), error) {
	u, err := url.Parse(to)
	if err != nil {
		return nil, nil, usagef("--to %q: %v", to, err)
	}
	q := u.Query()
	switch u.Scheme {
	case "redis", "rediss":
		return redisTarget(ctx, u, q, ackTimeout, log)
	case "nats", "tls":
		stream := q.Get("stream")
		if stream == "" {
			return nil, nil, usagef("--to %s: name the JetStream stream: nats://HOST:4222?stream=NAME", redact(to))
		}
		for k := range q {
			if k != "stream" && k != "subject" && k != "create" {
				return nil, nil, usagef("--to %s: unknown option %q (stream, subject, create)", redact(to), k)
			}
		}
		create := true
		switch v := q.Get("create"); v {
		case "", "true":
		case "false":
			create = false
		default:
			return nil, nil, usagef("--to %s: create=%q: use true or false", redact(to), v)
		}
		u.RawQuery = ""
		nc, err := nats.Connect(u.String(), nats.Name("postbox relay"), nats.MaxReconnects(-1),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil { // nil: closed by the relay
					log.Warn("relay: NATS connection lost; reconnecting", "err", err)
				}
			}),
			nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("relay: NATS reconnected", "url", nc.ConnectedUrlRedacted()) }))
		if err != nil {
			return nil, nil, fmt.Errorf("--to %s: %w", redact(to), err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		pub, err := outboxnats.NewPublisher(js, outboxnats.Config{Stream: stream, SubjectPrefix: q.Get("subject"), CreateStream: create, AckTimeout: ackTimeout})
		if err != nil {
			nc.Close()
			return nil, nil, usagef("--to %s: %v", redact(to), err)
		}
		return pub, nc.Close, nil
	case "kafka":
		return kafkaTarget(ctx, u, q, ackTimeout, log)
	case "ws", "wss":
		pub, err := client.NewPublisher(to, client.Options{Token: ws.token, Source: ws.source, Logger: log, AckTimeout: ackTimeout})
		if err != nil {
			return nil, nil, usagef("--to: %v", err)
		}
		if err := probeWS(ctx, to, ws, log); err != nil {
			pub.Close()
			return nil, nil, err
		}
		return pub, func() { pub.Close() }, nil
	}
	return nil, nil, usagef("--to %q: use redis://, nats://, kafka://, ws:// or wss://", redact(to))
}

// wsOptions are the settings of a ws:// or wss:// target: the token and
// the device source its events go to.
type wsOptions struct{ token, source string }

// probeWS connects once to a ws:// or wss:// target, as the other targets
// are pinged at the start: a server that refuses the token or has no
// ingress at that path is an error; one that does not answer yet is
// logged, and the relay sends once it does.
func probeWS(ctx context.Context, to string, ws wsOptions, log *slog.Logger) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := client.Dial(pctx, to, client.Options{Token: ws.token, Source: ws.source})
	if err == nil {
		conn.Close()
		return nil
	}
	var refused *client.APIError
	isRefused := errors.As(err, &refused)
	switch {
	case errors.Is(err, client.ErrUnauthorized) && ws.token != "":
		return fmt.Errorf("--to %s: the server refused the token given with --token: %w", redact(to), err)
	case errors.Is(err, client.ErrUnauthorized):
		return fmt.Errorf("--to %s: the server needs a token: give it with --token or POSTBOX_TOKEN: %w", redact(to), err)
	case isRefused && refused.Code == api.CodeNotFound && ws.source != "":
		return fmt.Errorf("--source %s: %w", ws.source, err)
	case isRefused && refused.Status < 500:
		return fmt.Errorf("--to %s: %w", redact(to), err)
	}
	log.Warn("relay: the target does not answer yet; the relay sends once it does", "to", redact(to), "err", err)
	return nil
}

func redisTarget(ctx context.Context, u *url.URL, q url.Values, ackTimeout time.Duration, log *slog.Logger) (outbox.Publisher, func(), error) {
	cfg := outboxredis.Config{Stream: q.Get("stream"), Logger: log}
	if cfg.Stream == "" {
		return nil, nil, usagef("--to %s: name the stream: redis://HOST:6379/0?stream=NAME", redact(u.String()))
	}
	if v := q.Get("maxlen"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, nil, usagef("--to: maxlen=%q is not a whole number", v)
		}
		cfg.MaxLen = n
	}
	if err := setIDMP(&cfg, q.Get("idmp"), q.Get("producer")); err != nil {
		return nil, nil, err
	}
	for _, k := range []string{"stream", "maxlen", "idmp", "producer"} {
		q.Del(k)
	}
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, nil, usagef("--to %s: %v", redact(u.String()), err)
	}
	opts.ContextTimeoutEnabled = true // so that --ack-timeout ends a stuck pipeline
	rc := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rc.Ping(pctx).Err(); err != nil {
		rc.Close()
		return nil, nil, fmt.Errorf("--to %s: %w", redact(u.String()), err)
	}
	pub, err := outboxredis.NewPublisher(rc, cfg)
	if err != nil {
		rc.Close()
		return nil, nil, usagef("--to: %v", err)
	}
	return timeoutPublisher{pub, ackTimeout}, func() { rc.Close() }, nil
}

// redisLogger sends go-redis's own messages (a failed dial, a pool
// problem) to the relay's log, in its format.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Warn("redis: " + strings.TrimPrefix(strings.TrimSpace(fmt.Sprintf(format, v...)), "redis: ")) // some of its messages say so already
}

// timeoutPublisher bounds each Publish, for a publisher without an ack
// timeout of its own.
type timeoutPublisher struct {
	outbox.Publisher
	timeout time.Duration
}

func (p timeoutPublisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	return p.Publisher.Publish(ctx, msgs)
}

// redact hides the password of a URL for logs and messages.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// setIDMP reads the idmp= and producer= options of a redis:// target.
func setIDMP(cfg *outboxredis.Config, mode, producer string) error {
	switch mode {
	case "", "auto":
		cfg.IDMP = outboxredis.IDMPAuto
	case "off":
		cfg.IDMP = outboxredis.IDMPOff
	case "on":
		cfg.IDMP = outboxredis.IDMPOn
	default:
		return usagef("--to: idmp=%q: use auto, on or off", mode)
	}
	cfg.ProducerID = producer
	return nil
}

// kafkaOptions are the query options of a kafka:// target.
var kafkaOptions = append([]string{"topic", "key", "client_id", "max_bytes"}, kafkaopt.Names...)

// kafkaTarget returns the publisher of a kafka://HOST:PORT[,HOST:PORT]?topic=
// target. Its usage errors name the option at fault and never the
// password.
func kafkaTarget(ctx context.Context, u *url.URL, q url.Values, ackTimeout time.Duration, log *slog.Logger) (outbox.Publisher, func(), error) {
	shown := redact(u.String())
	for k := range q {
		if !strings.Contains(","+strings.Join(kafkaOptions, ",")+",", ","+k+",") {
			return nil, nil, usagef("--to %s: unknown option %q (%s)", shown, k, strings.Join(kafkaOptions, ", "))
		}
	}
	cfg := outboxkafka.Config{Topic: q.Get("topic"), ClientID: q.Get("client_id"), DeliveryTimeout: ackTimeout, Logger: log}
	if cfg.Topic == "" {
		return nil, nil, usagef("--to %s: name the topic: kafka://HOST:9092?topic=NAME", shown)
	}
	brokers, err := kafkaopt.Brokers(u.Host)
	if err != nil {
		return nil, nil, usagef("--to %s: %v", shown, err)
	}
	cfg.Brokers = brokers
	switch q.Get("key") {
	case "", "correlation_id":
		cfg.Key = outboxkafka.KeyCorrelationID
	case "tenant_id":
		cfg.Key = outboxkafka.KeyTenantID
	case "event_id":
		cfg.Key = outboxkafka.KeyEventID
	default:
		return nil, nil, usagef("--to: key=%q: use correlation_id, tenant_id or event_id", q.Get("key"))
	}
	if v := q.Get("max_bytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return nil, nil, usagef("--to: max_bytes=%q is not a positive whole number", v)
		}
		cfg.MaxRecordBytes = n
	}
	if cfg.Options, err = kafkaopt.Options(u, q); err != nil {
		return nil, nil, usagef("--to: %v", err)
	}
	pub, err := outboxkafka.New(cfg)
	if err != nil {
		return nil, nil, usagef("--to %s: %v", shown, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pub.Ping(pctx); err != nil {
		pub.Close()
		return nil, nil, fmt.Errorf("--to %s: %w", shown, err)
	}
	return timeoutPublisher{pub, ackTimeout}, pub.Close, nil
}
