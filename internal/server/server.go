// Package server is the control plane of postbox serve: the stream
// backend and its writer, the delivery store, the ingress transports and
// the HTTP endpoints, with one lifetime.
//
// It runs on any stream.Backend. Events are appended through a Writer: the
// backend's own when it has one (streamsqlite's single group-commit
// writer), else an appendq.Queue that gives any backend the same bounded
// queue and group commits. Which backend and store to open is wiring, done
// by the callers (postbox serve, the public server package).
package server

import (
	"context"
	"crypto/tls"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/appendq"
	"github.com/postbox-events/postbox/internal/buildinfo"
	"github.com/postbox-events/postbox/internal/console"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/forwarded"
	"github.com/postbox-events/postbox/internal/httpdeadline"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/ingresspb"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/stream"
)

// DeviceSource is the source (and stream) of events from edge devices.
const DeviceSource = "devices"

// ShutdownTimeout bounds how long Run waits at shutdown for connections to
// answer the envelopes they already read.
const ShutdownTimeout = 5 * time.Second

// Config configures a Server.
type Config struct {
	Addr string // listen address; defaults to ":8000"
	// Streams is the stream backend events are appended to and read from.
	// Required. When it is a Writer (streamsqlite.Backend), its own writer
	// appends; otherwise an appendq.Queue with MaxBatch, QueueSize and
	// QueueBytes does. Run closes it.
	Streams stream.Backend
	// Store is the SQL database delivery state (subscriptions, inbox
	// items, read positions) and the server's probe row live in. Required;
	// it may be Streams itself (the SQLite default: one file, one writer).
	// When it is another object with a Run(ctx) error method, Run runs it
	// beside the writer. Run closes it if it has a Close() error method.
	Store delivery.Store
	// DBPath and Synchronous describe the SQLite file of the default
	// wiring, which opens it (the server logs them); DBPath defaults to
	// DefaultDBPath, Synchronous to FULL.
	DBPath      string
	Synchronous string
	// WALCheckpoint says who checkpoints the SQLite file's write-ahead
	// log: sqlitedb.CheckpointAuto (the default, the store itself) or
	// sqlitedb.CheckpointLitestream (Litestream, which replicates it).
	WALCheckpoint string
	// MaxBatch, QueueSize and QueueBytes bound the writer: events per
	// group commit (1 = one commit per event), and the events and bytes
	// queued for it (QUEUE_MAXSIZE). The wiring that opens SQLite passes
	// them to streamsqlite; for another backend they configure the
	// appendq.Queue. Zero takes the defaults of groupcommit and appendq.
	MaxBatch   int
	QueueSize  int
	QueueBytes int
	Limits     postbox.Limits
	Tokens     ingress.Tokens // nil: no authentication
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// a request's client (serve's --trusted-proxies): from them, the
	// client's address replaces the request's RemoteAddr (in logs, a
	// webhook's metadata, the ingress's connections per address). From
	// any other peer the header is ignored. None: it always is.
	TrustedProxies forwarded.Proxies
	// TokenRateLimit, when not zero, bounds the events each device token
	// sends through the ingress (serve's --token-rate-limit), over every
	// node of a shared store: a connection over it is held until its
	// budget refills.
	TokenRateLimit intakerate.Rate
	// Webhooks configures POST /webhooks.
	Webhooks WebhookConfig
	// Delivery configures workers, retries, dead letters and retention;
	// the server sets its Logger and Metrics.
	Delivery delivery.Config
	// Handlers are Go functions that complete the items of inboxes (by
	// inbox name), for programs that embed the server.
	Handlers map[string]delivery.Handler
	// APIToken, when set, is the bearer token the operator API (/v1/
	// subscriptions, streams, consumers, inboxes) requires.
	APIToken string
	// AllowedHosts are the names, besides IP addresses, localhost and
	// the host of Addr, the operator API, the console and /metrics answer
	// under ("postbox.example.com"; ".example.com" takes its subdomains;
	// "*" any name). Others get 421: a page that rebinds its DNS name to
	// the server could otherwise read the API.
	AllowedHosts []string
	// AllowedOrigins are the origins besides the server's own
	// ("https://ops.example.com") whose browser pages may change state
	// through the operator API; others get 403.
	AllowedOrigins []string
	TLSCert        string
	TLSKey         string
	Logger         *slog.Logger
	// PingInterval and PingTimeout: see ingress.Config.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// WSMaxConnections, WSBufferBytes, WSMaxFrameBytes and WSFrameTimeout:
	// see ingress.Config's MaxConnections, MaxBufferedBytes, MaxFrameBytes
	// and FrameTimeout.
	WSMaxConnections int
	WSBufferBytes    int64
	WSMaxFrameBytes  int64
	WSFrameTimeout   time.Duration
	// SourceBufferBytes bounds the memory of poll answers and feed lines
	// being read and of their events waiting to be stored, over every
	// poll and feed source; one answer or line is at most half of it.
	// Defaults to DefaultSourceBufferBytes.
	SourceBufferBytes int64
	// WSMaxConnectionsPerAddress: see ingress.Config.MaxConnectionsPerAddress.
	WSMaxConnectionsPerAddress int
	// Listener, when set, is served instead of listening on Addr.
	Listener net.Listener
	// GRPCAddr, when set, is the listen address of the gRPC ingress
	// (with TLSCert and TLSKey, over TLS); GRPCListener, when set, is
	// served instead. Without either there is no gRPC ingress.
	GRPCAddr     string
	GRPCListener net.Listener
	// InsecureNoAPIToken lets Run serve the operator API without an
	// APIToken on an address beyond loopback. Without it Run refuses to
	// start there: whoever reaches the address could point subscriptions
	// at any target and read every inbox.
	InsecureNoAPIToken bool

	// ReadTimeout bounds how long a request's body may take to arrive
	// after its headers (the headers get the shorter of ReadTimeout and
	// DefaultReadHeaderTimeout). Defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no request
	// for this long. Defaults to DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; larger ones get 431.
	// Defaults to DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// MaxConnections bounds the open TCP connections (HTTP, WebSocket
	// and TLS alike); more are closed as soon as they are accepted.
	// Defaults to DefaultMaxConnections.
	MaxConnections int
	// StoreProbeInterval is how often, while the store cannot commit, a
	// probe write checks whether it can again. Defaults to
	// DefaultStoreProbeInterval.
	StoreProbeInterval time.Duration
	// StatsInterval is how often GET /v1/stats takes a sample of the
	// counters it charts. Defaults to DefaultStatsInterval.
	StatsInterval time.Duration
}

// DefaultDBPath is the SQLite file of the default wiring when
// Config.DBPath is empty.
const DefaultDBPath = "data/postbox.db"

// DefaultStoreProbeInterval is how often a probe write checks whether a
// store that failed a commit can commit again.
const DefaultStoreProbeInterval = time.Second

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations holds the migrations of the server's own table (component
// "server"), applied to a store that is also the stream backend.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// Writer is the asynchronous, bounded, group-committed append path the
// ingress and POST /webhooks write through. streamsqlite.Backend and
// appendq.Queue are Writers.
type Writer interface {
	// AppendAsync queues events and calls done (which must not block)
	// after they are stored, or with an error; it blocks while the queue
	// is full.
	AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error
	// TryAppendAsync is AppendAsync that returns groupcommit.ErrFull
	// instead of waiting for room.
	TryAppendAsync(streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error
	// QueueLen, QueueBytes and QueueCap: the events and bytes waiting,
	// and the bound in events.
	QueueLen() int
	QueueBytes() int
	QueueCap() int
	// Run writes until ctx ends, then writes what is still queued.
	Run(ctx context.Context) error
}

// observer is a Writer that reports each group commit (streamsqlite's
// Observe); the server counts them in its metrics and store health.
type observer interface {
	Observe(fn func(events int, took time.Duration, err error))
}

// syncObserver is a Writer that syncs its commits to the disk apart from
// them (streamsqlite with FULL) and reports each sync.
type syncObserver interface {
	ObserveSync(fn func(commits int, took time.Duration, err error))
}

// retryObserver is a Writer that tries a group commit again when it
// failed for a transient reason, and tells before each try.
type retryObserver interface {
	ObserveRetry(fn func(events, attempt int, wait time.Duration, err error))
}

// Server is a running control plane.
type Server struct {
	cfg      Config
	log      *slog.Logger
	streams  stream.Backend
	store    delivery.Store
	writer   Writer
	delivery *delivery.Delivery // for the lifetime (Run, recovery, /ready), leadership and the webhooks' default subscription; their status goes through roles.events
	roles                       // what the API's handlers use of delivery (roles.go)
	metrics  *ingress.Metrics
	// webhookKeys are the decoded Webhooks.Secrets.
	webhookKeys [][]byte
	sources     sourceCache         // webhook sources read recently (sources.go)
	wh          webhookState        // the webhook intake's own (webhooks.go)
	runner      *intake.Runner      // the adapters of sources that read upstream
	sourceStore *intake.Store       // sources and their checkpoints
	limiter     *intakerate.Limiter // the sources' and tokens' rate limits
	ingress     *ingress.Ingress
	reg         *prometheus.Registry
	ln          net.Listener
	mux         *http.ServeMux
	guard       *browserGuard
	routes      []string // the mux's patterns, in the order handle registered them

	conns       *connLimit
	storeHealth *storeHealth
	stats       *statsSampler
	deviceGate  *intake.Gate // whether the device source takes events
	// deviceSources are the other device sources a connection may name.
	deviceSources *deviceSources
	closeOnce     sync.Once
	closeErr      error

	mu       sync.Mutex
	ready    bool
	stopping context.Context // done once Run begins to shut down
}

// New prepares the server on cfg.Streams and cfg.Store; Run serves it.
// When New fails, closing them is left to the caller.
func New(cfg Config) (*Server, error) {
	if cfg.Streams == nil || cfg.Store == nil {
		return nil, configErrorf("Config.Streams and Config.Store are required (NewDefault opens the SQLite default)")
	}
	cfg.setDefaults()
	guard, err := newBrowserGuard(cfg)
	if err != nil {
		return nil, err
	}
	var webhookKeys [][]byte
	for _, secret := range cfg.Webhooks.Secrets {
		key, err := stdwebhook.CheckSecret(secret)
		if err != nil {
			return nil, configErrorf("Config.Webhooks.Secrets: %v", err)
		}
		webhookKeys = append(webhookKeys, key)
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, configErrorf("Config.TLSCert and Config.TLSKey go together: set both or neither")
	}
	health := newStoreHealth()
	m := newRegistries(health, cfg.Logger)
	reg, statsReg := m.reg, m.stats
	writer := m.writer(cfg)
	store := cfg.Store
	if any(store) == any(cfg.Streams) { // the probe row of a store that is the stream backend
		if err := store.Migrate(context.Background(), "server", Migrations()); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	m.registerQueue(writer)
	metrics := ingress.NewMetrics(teeRegisterer{reg, statsReg})
	if !cfg.TokenRateLimit.IsZero() {
		if err := cfg.TokenRateLimit.Validate("Config.TokenRateLimit"); err != nil {
			return nil, configErrorf("%v", err)
		}
	}
	limiter := intakerate.NewMemory()
	if _, shared := store.(delivery.SharedStore); shared {
		limiter = intakerate.NewShared(store)
	}
	gate := intake.NewGate(DeviceSource, sourceCacheTTL, cfg.Logger)
	devices := newDeviceSources(cfg.Logger)
	in, err := ingress.New(writer, ingress.Config{
		SourceGone:   gate.Check,
		Source:       devices.resolve,
		StreamID:     DeviceSource,
		Limits:       cfg.Limits,
		Tokens:       cfg.Tokens,
		TokenRate:    cfg.TokenRateLimit,
		RateLimiter:  limiter,
		PingInterval: cfg.PingInterval,
		PingTimeout:  cfg.PingTimeout,
		Logger:       cfg.Logger,
		Metrics:      metrics,

		MaxConnections:   cfg.WSMaxConnections,
		MaxBufferedBytes: cfg.WSBufferBytes,
		MaxFrameBytes:    cfg.WSMaxFrameBytes,
		FrameTimeout:     cfg.WSFrameTimeout,

		MaxConnectionsPerAddress: cfg.WSMaxConnectionsPerAddress,
	})
	if err != nil {
		return nil, err
	}
	dcfg := cfg.Delivery
	dcfg.Logger, dcfg.Metrics = cfg.Logger, delivery.NewMetrics(teeRegisterer{reg, statsReg})
	var srcs *intake.Store
	dcfg.ReplySettings = replySettings(&srcs)
	dl, err := delivery.New(context.Background(), cfg.Streams, store, dcfg)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	srcs, err = openSources(cfg, store, dl)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	gate.Use(srcs)
	devices.Use(srcs)
	for inbox, h := range cfg.Handlers {
		dl.Handle(inbox, h)
	}
	reg.MustRegister(dl.LagCollector(), dl.InboxCollector(), dl.NodeCollector(), buildInfoGauge())
	s := &Server{cfg: cfg, log: cfg.Logger, streams: cfg.Streams, store: store, writer: writer, delivery: dl, roles: rolesOf(dl), metrics: metrics, webhookKeys: webhookKeys, ingress: in, reg: reg, sourceStore: srcs, limiter: limiter,
		mux: http.NewServeMux(), guard: guard, conns: newConnLimit(reg, cfg.MaxConnections), storeHealth: health}
	s.stats = &statsSampler{gather: statsReg, started: time.Now().UTC(), interval: cfg.StatsInterval, lag: s.subscriptionLags,
		queue: func() (int, int) { return writer.QueueLen(), writer.QueueCap() }}
	if s.runner, err = s.newSourceRunner(reg); err != nil {
		return nil, err
	}
	s.deviceGate, s.deviceSources = gate, devices
	s.route()
	return s, nil
}

// setDefaults gives the zero fields of c their defaults: Addr ":8000",
// DBPath DefaultDBPath, a Logger that discards, and the Default… of
// Webhooks.MaxBytes, ReadTimeout, IdleTimeout, MaxHeaderBytes,
// MaxConnections, StoreProbeInterval and StatsInterval. A negative bound
// takes its default too.
func (c *Config) setDefaults() {
	if c.Addr == "" {
		c.Addr = ":8000"
	}
	if c.DBPath == "" {
		c.DBPath = DefaultDBPath
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Webhooks.MaxBytes <= 0 {
		c.Webhooks.MaxBytes = DefaultWebhookMaxBytes
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.StoreProbeInterval <= 0 {
		c.StoreProbeInterval = DefaultStoreProbeInterval
	}
	if c.StatsInterval <= 0 {
		c.StatsInterval = DefaultStatsInterval
	}
}

// route registers every route of the server on its mux: the operator API
// (api.go, consumers.go), GET /v1/stats, the console, the webhooks, the
// WebSocket ingress, /health, /ready and /metrics, and last noRoute for
// what no route takes.
func (s *Server) route() {
	s.routeAPI()
	s.routeConsumers()
	s.routeOperate()
	s.routeReplies()
	s.handle("GET /v1/stats", s.requireToken(s.getStats))
	s.handle("GET "+console.Path, console.Handler()) // static files, no token (the pages send it to the API); the mux redirects /ui here
	s.handle("POST /webhooks", http.HandlerFunc(s.postWebhook))
	s.handle("GET /webhooks/{source}", s.requireToken(s.getWebhook)) // {source} is a webhook id here: one name per path, as POST /webhooks/{source}
	s.handle("GET /webhooks", s.requireToken(s.findWebhook))
	s.handle("GET "+ingress.WSPath, s.ingress)
	s.handle("GET /health", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": buildinfo.Get().Version})
	}))
	s.handle("GET /ready", http.HandlerFunc(s.handleReady))
	// /metrics names subscriptions and inboxes: it takes the API token
	// when one is set (Prometheus sends it with authorization.credentials).
	s.handle("GET /metrics", s.requireToken(promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{Registry: s.reg}).ServeHTTP))
	s.mux.HandleFunc("/", s.noRoute) // what no route takes; not one of Routes
}

// handle registers h for pattern and records the pattern for Routes.
func (s *Server) handle(pattern string, h http.Handler) {
	s.routes = append(s.routes, pattern)
	s.mux.Handle(pattern, h)
}

// Routes returns the patterns of every route the server serves
// ("GET /health", "POST /v1/subscriptions", ...), for tests that check
// docs/openapi.json against them.
func (s *Server) Routes() []string { return slices.Clone(s.routes) }

// Streams returns the server's stream backend.
func (s *Server) Streams() stream.Backend { return s.streams }

// Writer returns the writer events are appended through: the stream
// backend's own, or the appendq.Queue around it.
func (s *Server) Writer() Writer { return s.writer }

// Close closes the stream backend and the store (once, when they are the
// same object), each that has a Close() error method. Run calls it when
// it returns; a server that never ran is closed with it. It is safe to
// call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if c, ok := s.streams.(interface{ Close() error }); ok {
			errs = append(errs, c.Close())
		}
		if c, ok := s.store.(interface{ Close() error }); ok && !s.sameStore() {
			errs = append(errs, c.Close())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// sameStore reports whether the store is the stream backend itself (the
// SQLite default): then its writer is the store's writer too.
func (s *Server) sameStore() bool { return any(s.store) == any(s.streams) }

// Handler returns the server's HTTP handler (without the limits Run adds
// to its connections).
func (s *Server) Handler() http.Handler {
	routed := func(r *http.Request) bool { _, pattern := s.mux.Handler(r); return pattern != "/" }
	return withClientAddr(withRequestID(withCleanPath(s.guard.wrap(withQuery(s.mux), routed)), s.log), s.cfg.TrustedProxies)
}

// withClientAddr sets a request's RemoteAddr to its client's address
// when it came through one of trusted (forwarded.Proxies.ClientAddr).
func withClientAddr(h http.Handler, trusted forwarded.Proxies) http.Handler {
	if len(trusted) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			r.RemoteAddr = trusted.ClientAddr(r.RemoteAddr, xff)
		}
		h.ServeHTTP(w, r)
	})
}

// Listen binds the listener (if Config.Listener is not set) and returns
// its address. Run calls it if it was not called.
func (s *Server) Listen() (net.Addr, error) {
	if s.ln != nil {
		return s.ln.Addr(), nil
	}
	if s.cfg.Listener != nil {
		s.ln = s.cfg.Listener
		return s.ln.Addr(), nil
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", s.cfg.Addr, err)
	}
	s.ln = ln
	return ln.Addr(), nil
}

// Run starts the writer, prepares the stream, serves until ctx ends, then
// stops accepting, lets the writer commit and answer what it holds, and
// closes the stream backend and the store.
func (s *Server) Run(ctx context.Context) error {
	defer s.Close()
	addr, err := s.Listen()
	if err != nil {
		return err
	}
	if err := s.checkOpen(addr); err != nil {
		s.ln.Close()
		return err
	}
	grpcSrv, grpcLn, grpcAddr, err := s.newGRPC()
	if err != nil {
		s.ln.Close()
		return err
	}
	if _, err := s.streams.EnsureStream(ctx, DeviceSource); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	storeCtx, stopStore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStore()
	connCtx, stopConns := context.WithCancel(context.WithoutCancel(ctx))
	defer stopConns()
	g, gctx := errgroup.WithContext(ctx)
	s.mu.Lock()
	s.stopping = gctx // ends long-polling leases when shutdown begins
	s.mu.Unlock()
	srv := &http.Server{
		Handler:           httpdeadline.Body(s.Handler(), s.cfg.ReadTimeout),
		ReadHeaderTimeout: min(s.cfg.ReadTimeout, DefaultReadHeaderTimeout),
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		// WebSocket sessions are hijacked: Shutdown does not end them;
		// Drain does, and the end of this context if Drain takes too long.
		BaseContext: func(net.Listener) context.Context { return connCtx },
	}
	g.Go(func() error { return s.writer.Run(storeCtx) })
	if r, ok := s.store.(interface{ Run(context.Context) error }); ok && !s.sameStore() {
		g.Go(func() error { return r.Run(storeCtx) }) // a store with a writer of its own (SQLite beside another backend)
	}
	g.Go(func() error { return s.probeStore(gctx) })
	g.Go(func() error { return s.stats.Run(gctx) })
	deliveryCtx, stopDelivery := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDelivery()
	deliveryDone := make(chan struct{})
	recovered := make(chan struct{})
	g.Go(func() error {
		defer close(deliveryDone)
		if err := s.recover(deliveryCtx); err != nil {
			if deliveryCtx.Err() != nil {
				return nil // stopped before it started
			}
			return err
		}
		close(recovered)
		return s.delivery.Run(deliveryCtx)
	})
	sourcesDone := make(chan struct{})
	g.Go(func() error {
		defer close(sourcesDone)
		select { // after recovery, as delivery
		case <-recovered:
		case <-deliveryDone:
			return nil
		}
		return s.runner.Run(deliveryCtx)
	})
	g.Go(func() error {
		var err error
		ln := &limitListener{Listener: s.ln, l: s.conns}
		if s.cfg.TLSCert != "" {
			srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
			err = srv.ServeTLS(ln, s.cfg.TLSCert, s.cfg.TLSKey)
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	if grpcSrv != nil {
		g.Go(func() error { return grpcSrv.Serve(grpcLn) })
	}
	g.Go(func() error {
		<-gctx.Done()
		s.setReady(false) // /ready says 503 while draining
		s.log.Info("postbox serve: shutting down; answering what the connections already read")
		// Stop accepting, let every connection answer what it read (the
		// store still commits), then stop the store.
		shut, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(shut); err != nil {
			srv.Close()
		}
		grpcStopped := stopGRPC(grpcSrv) // stops accepting; streams go on until drained
		if err := s.ingress.Drain(shut); err != nil {
			s.log.Warn("postbox serve: connections still busy at shutdown; closing them", "timeout", ShutdownTimeout)
		}
		select {
		case <-grpcStopped:
		case <-shut.Done():
			if grpcSrv != nil { // without one grpcStopped is closed, but select may pick this case
				grpcSrv.Stop()
			}
			<-grpcStopped
		}
		stopConns()
		stopDelivery() // its loops and the sources' adapters write through the store: stop them first
		<-deliveryDone
		<-sourcesDone
		stopStore() // the writer and the store commit what they hold, then return
		return nil
	})
	g.Go(func() error {
		if err := s.ensureWebhooks(gctx); err != nil {
			if gctx.Err() != nil {
				return nil // stopped before it started
			}
			return fmt.Errorf("webhooks: %w", err)
		}
		s.deviceGate.Arm() // the default sources exist: a missing one was deleted
		select {
		case <-recovered:
		case <-gctx.Done():
			return nil
		}
		s.setReady(true) // /ready says 200 once interrupted work is pending again and webhooks have their subscription
		return nil
	})
	scheme := "ws"
	if s.cfg.TLSCert != "" {
		scheme = "wss"
	}
	where := []any{"db", s.cfg.DBPath, "synchronous", s.synchronous()}
	if s.cfg.WALCheckpoint != "" && s.cfg.WALCheckpoint != "auto" {
		where = append(where, "wal_checkpoint", s.cfg.WALCheckpoint) // litestream: the log grows unless Litestream runs
	}
	if _, shared := s.store.(delivery.SharedStore); shared { // no SQLite file
		where = []any{"store", "postgres", "node", s.delivery.Node()}
	}
	at := append(append([]any{"addr", addr.String(), "ingress", scheme + "://" + addr.String() + ingress.WSPath},
		where...), "writer", s.writerKind(), "auth", s.cfg.Tokens != nil)
	if grpcAddr != "" {
		at = append(at, "grpc", grpcAddr)
	}
	s.log.Info("postbox serve: listening", at...)
	err = g.Wait()
	s.setReady(false)
	if err != nil {
		s.log.Error("postbox serve: stopped", "err", err)
	} else {
		s.log.Info("postbox serve: stopped")
	}
	return err
}

// recover returns the work a previous process left processing to pending
// and logs what the inboxes hold (boot rehydration).
func (s *Server) recover(ctx context.Context) error {
	b, err := s.delivery.Recover(ctx)
	if err != nil {
		return fmt.Errorf("startup recovery: %w", err)
	}
	oldest := "none"
	if !b.OldestPending.IsZero() {
		oldest = time.Since(b.OldestPending).Round(time.Second).String()
	}
	s.log.Info("postbox serve: startup recovery done", "interrupted_items_returned", b.Recovered, "pending", b.Pending,
		"dead_letters", b.Failed, "oldest_pending_age", oldest)
	return nil
}

// writerKind names the writer for the start log: the backend's own, or
// the queue around it.
func (s *Server) writerKind() string {
	if _, ok := s.writer.(*appendq.Queue); ok {
		return "group-commit queue"
	}
	return "backend"
}

func (s *Server) synchronous() string {
	if s.cfg.Synchronous == "" {
		return "FULL"
	}
	return s.cfg.Synchronous
}

// checkOpen refuses to serve the operator API without a token on an
// address beyond loopback (unless InsecureNoAPIToken says so), and logs
// loudly when anyone on the network may send events.
func (s *Server) checkOpen(addr net.Addr) error {
	if tcp, ok := addr.(*net.TCPAddr); !ok || tcp.IP.IsLoopback() {
		return nil
	}
	where := addr.String()
	if s.cfg.Listener == nil && s.cfg.Addr != "" {
		where = s.cfg.Addr // as the operator wrote it: 0.0.0.0:8000, not [::]:8000
	}
	if s.cfg.APIToken == "" {
		if !s.cfg.InsecureNoAPIToken {
			return configErrorf("serving on %s, beyond loopback, without an API token: anyone who can reach it "+
				"could point subscriptions at any target and read every inbox. Set Config.APIToken, "+
				"listen on loopback (Config.Addr 127.0.0.1:PORT), or set Config.InsecureNoAPIToken "+
				"to serve the operator API open anyway", where)
		}
		s.log.Warn("!!! postbox serve listens beyond loopback WITHOUT an API token (--insecure-no-api-token): anyone who can reach " +
			where + " may create subscriptions and lease, ack and read inbox items.")
	}
	if s.cfg.Tokens == nil {
		s.log.Warn("!!! postbox serve listens beyond loopback WITHOUT authentication: anyone who can reach " +
			where + " may send events. Pass --auth-tokens FILE (and --tls-cert/--tls-key) to require bearer tokens.")
	}
	return nil
}

func (s *Server) setReady(v bool) {
	s.mu.Lock()
	s.ready = v
	s.mu.Unlock()
}

func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	if !s.isReady() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "starting"})
		return
	}
	if err, since := s.storeHealth.failure(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "store_unwritable",
			"reason": "the store cannot commit: " + err.Error(), "since": since})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "node": s.delivery.Node(), "queue_depth": s.writer.QueueLen(),
		"queue_capacity": s.writer.QueueCap()})
}

// storeHealth says whether the store commits: a failed group commit marks
// it unwritable, and only a probe write that commits marks it writable
// again (a batch of functions whose writes failed inside their savepoints
// still commits, so a successful commit alone proves nothing).
type storeHealth struct {
	mu    sync.Mutex
	err   error
	since time.Time
	gen   int           // failures so far, so that a probe older than a failure does not clear it
	wake  chan struct{} // signalled on a failure
}

func newStoreHealth() *storeHealth { return &storeHealth{wake: make(chan struct{}, 1)} }

func (h *storeHealth) fail(err error) {
	h.mu.Lock()
	if h.err == nil {
		h.since = time.Now().UTC()
	}
	h.err = err
	h.gen++
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// failure returns the last failure and when failing began, or nil.
func (h *storeHealth) failure() (error, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err, h.since
}

func (h *storeHealth) generation() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gen
}

// recovered clears the failure unless another came after gen.
func (h *storeHealth) recovered(gen int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen {
		return false
	}
	h.err = nil
	return true
}

// probeStore, while the store cannot commit, probes it every
// StoreProbeInterval until a probe succeeds, so that /ready recovers
// without traffic. It probes nothing while the store commits.
func (s *Server) probeStore(ctx context.Context) error {
	h := s.storeHealth
	t := time.NewTimer(0)
	t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-h.wake:
		}
		for {
			if err, _ := h.failure(); err == nil {
				break
			}
			t.Reset(s.cfg.StoreProbeInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			gen := h.generation()
			err := s.probe(ctx)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil:
				h.fail(err)
			case h.recovered(gen):
				s.log.Info("postbox serve: the store commits again")
			}
		}
	}
}

// probe checks once whether the writer's backend can store again.
//
// When the store is the stream backend (SQLite), a probe row written
// through the store goes through the very writer whose commit failed: its
// commit proves the next batch of events can commit too.
//
// Another backend is probed with Stats of the device stream. A write
// would be an event (a stream of probes the API would list, or an
// identity stored once that proves nothing the second time); Stats needs
// what an append needs, the backend reachable and the stream's leader
// answering. A backend that reads but cannot write (a full disk) fails
// the next append again and is marked unwritable again: its events are
// NACKed as retryable either way.
func (s *Server) probe(ctx context.Context) error {
	if _, queued := s.writer.(*appendq.Queue); !queued && s.sameStore() {
		return s.store.Update(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE server_store_probe SET probed_at = ? WHERE id = 1`,
				time.Now().UTC().Format(time.RFC3339Nano))
			return err
		})
	}
	_, err := s.streams.Stats(ctx, DeviceSource)
	return err
}

// newGRPC returns the gRPC server of the ingress and its listener on
// GRPCAddr (or GRPCListener), and the URL it serves; nil and empty
// without either.
func (s *Server) newGRPC() (*grpc.Server, net.Listener, string, error) {
	ln := s.cfg.GRPCListener
	if ln == nil {
		if s.cfg.GRPCAddr == "" {
			return nil, nil, "", nil
		}
		var err error
		if ln, err = net.Listen("tcp", s.cfg.GRPCAddr); err != nil {
			return nil, nil, "", fmt.Errorf("listen %s (gRPC): %w", s.cfg.GRPCAddr, err)
		}
	}
	opts := s.ingress.ServerOptions()
	scheme := "grpc"
	if s.cfg.TLSCert != "" {
		creds, err := credentials.NewServerTLSFromFile(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			ln.Close()
			return nil, nil, "", fmt.Errorf("gRPC TLS: %w", err)
		}
		opts, scheme = append(opts, grpc.Creds(creds)), "grpcs"
	}
	gs := grpc.NewServer(opts...)
	ingresspb.RegisterIngressServer(gs, s.ingress.GRPC())
	return gs, ln, scheme + "://" + ln.Addr().String(), nil
}

// stopGRPC stops gs accepting and returns a channel closed once its
// streams ended (all of them at once with gs.Stop); nil gs is stopped.
func stopGRPC(gs *grpc.Server) <-chan struct{} {
	done := make(chan struct{})
	if gs == nil {
		close(done)
		return done
	}
	go func() { gs.GracefulStop(); close(done) }()
	return done
}

// buildInfoGauge is postbox_build_info: 1, labelled with which postbox
// this is, so that dashboards can show (and join on) the version.
func buildInfoGauge() prometheus.Collector {
	bi := buildinfo.Get()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "postbox_build_info",
		Help:        "Always 1; its labels say which postbox runs: version, commit and Go version.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "commit": bi.Commit, "go_version": bi.GoVersion},
	}, func() float64 { return 1 })
}
