// Package agent is postbox agent: the edge device's durable outbox, a local
// HTTP intake that lets a program in any language hand it events, and the
// relay that sends them to the control plane and deletes each only after
// its ACK.
package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/httpdeadline"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/tlsca"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// Config configures an Agent.
type Config struct {
	Server     string // the control plane's ingress: ws://host:port[/path] or grpc://host:port (wss, grpcs for TLS)
	OutboxPath string
	DeviceID   string
	SessionID  string // filled into events without one; defaults to a new sess_<ULID>
	Listen     string // the intake's address; defaults to 127.0.0.1:8787
	Token      string
	// Source is the server's device source the events go to; "" is
	// its default, devices (client.Options.Source).
	Source string
	// CACert is a PEM file of the certificate authorities (or the
	// self-signed certificate) a wss:// or grpcs:// server must present.
	// Empty means the system's roots.
	CACert      string
	Synchronous string
	// WALCheckpoint says who checkpoints the outbox's write-ahead log:
	// "auto" (the default: the outbox) or "litestream" (Litestream, which
	// replicates it); see outboxsqlite.Config.Checkpoint.
	WALCheckpoint string
	Limits        postbox.Limits
	Relay         outbox.RelayConfig
	AckTimeout    time.Duration
	// ReadTimeout bounds how long an intake request's body may take to
	// arrive after its headers; a slower one is answered 408
	// request_timeout. Defaults to DefaultReadTimeout.
	ReadTimeout time.Duration
	Logger      *slog.Logger
	// Listener, when set, is served instead of listening on Listen.
	Listener net.Listener
}

// Agent is a running edge agent.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	store  *outboxsqlite.Store
	pub    *client.Publisher
	relay  *outbox.Relay
	ln     net.Listener
	intake *intake
	lock   *sqlitedb.FileLock // the outbox's
}

// New opens the outbox and prepares the agent; Run runs it.
func New(cfg Config) (*Agent, error) {
	if cfg.DeviceID == "" {
		return nil, errors.New("agent: a device id is required")
	}
	if cfg.OutboxPath == "" {
		return nil, errors.New("agent: an outbox path is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:8787"
	}
	if cfg.SessionID == "" {
		cfg.SessionID = "sess_" + ulid.MustNew(ulid.Now(), rand.Reader).String()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if err := checkIDs(cfg); err != nil {
		return nil, err
	}
	switch strings.ToUpper(cfg.Synchronous) {
	case "", sqlitedb.SyncFull, sqlitedb.SyncNormal:
	default:
		return nil, fmt.Errorf("agent: synchronous must be FULL or NORMAL, not %q", cfg.Synchronous)
	}
	opts := client.Options{Token: cfg.Token, Source: cfg.Source, Logger: cfg.Logger, AckTimeout: cfg.AckTimeout}
	if cfg.CACert != "" {
		tc, err := tlsca.Config(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("agent: --ca-cert: %w", err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tc
		opts.HTTPClient, opts.TLSConfig = &http.Client{Transport: tr}, tc
	}
	pub, err := client.NewPublisher(cfg.Server, opts)
	if err != nil {
		return nil, fmt.Errorf("agent: --server: %w", err)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, pub: pub}
	// The intake's address is bound before the outbox is opened, so that
	// a bad or taken address leaves no outbox behind.
	if err := a.bind(); err != nil {
		pub.Close()
		return nil, err
	}
	// One agent relays an outbox: a second would send every row again.
	lock, err := sqlitedb.Lock(cfg.OutboxPath)
	if err != nil {
		pub.Close()
		a.ln.Close()
		return nil, fmt.Errorf("agent: outbox %w", err)
	}
	store, err := outboxsqlite.Open(cfg.OutboxPath, outboxsqlite.Config{Synchronous: cfg.Synchronous, Checkpoint: cfg.WALCheckpoint})
	if err != nil {
		pub.Close()
		a.ln.Close()
		lock.Unlock()
		return nil, err
	}
	m := newMetrics(store)
	rcfg := cfg.Relay
	rcfg.Logger = cfg.Logger
	rcfg.Observe = m.relay.Observe
	if observe := cfg.Relay.Observe; observe != nil {
		rcfg.Observe = func(st outbox.Stats) {
			m.relay.Observe(st)
			observe(st)
		}
	}
	relay, err := outbox.NewRelay(store, pub, rcfg)
	if err != nil {
		pub.Close()
		a.ln.Close()
		store.Close()
		lock.Unlock()
		return nil, err
	}
	a.store, a.relay, a.lock = store, relay, lock
	a.intake = &intake{store: store, deviceID: cfg.DeviceID, sessionID: cfg.SessionID, limits: cfg.Limits, readTimeout: cfg.ReadTimeout, log: cfg.Logger, m: m}
	return a, nil
}

// checkIDs refuses a device or session id that events could not carry,
// by the rules the intake checks each event by.
func checkIDs(cfg Config) error {
	probe := postbox.Envelope{SchemaVersion: postbox.SchemaVersion, EventID: "evt_probe", Type: "probe",
		TS: time.Now().UTC().Format(time.RFC3339Nano), DeviceID: cfg.DeviceID, SessionID: cfg.SessionID, Payload: []byte("{}")}
	if err := probe.Validate(cfg.Limits); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// Store returns the agent's outbox.
func (a *Agent) Store() *outboxsqlite.Store { return a.store }

// Listen returns the address of the intake, which New bound.
func (a *Agent) Listen() (net.Addr, error) { return a.ln.Addr(), nil }

// bind binds the intake: Config.Listener, else Config.Listen.
func (a *Agent) bind() error {
	if a.cfg.Listener != nil {
		a.ln = a.cfg.Listener
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("agent: listen %s: %w", a.cfg.Listen, err)
	}
	a.ln = ln
	return nil
}

// Run serves the intake and relays the outbox until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	defer a.lock.Unlock()
	defer a.store.Close()
	defer a.pub.Close()
	defer a.ln.Close() // Serve closed it, unless Run returns before
	addr := a.ln.Addr()
	if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		a.log.Warn("agent: the intake listens beyond loopback and has no authentication; anyone who reaches it may queue events", "listen", addr.String())
	}
	pending, rejected, err := a.store.Counts(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	storeCtx, stopStore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStore()
	srv := &http.Server{Handler: httpdeadline.Body(a.intake.handler(), a.cfg.ReadTimeout), ReadHeaderTimeout: 10 * time.Second}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.store.Run(storeCtx) })
	g.Go(func() error { return a.relay.Run(gctx) })
	g.Go(func() error {
		if err := srv.Serve(a.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			a.log.Info("postbox agent: shutting down; answering the intake's requests and committing what they queued")
		}
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
		stopStore() // after the intake stopped: queued inserts are committed and answered
		return nil
	})
	a.log.Info("postbox agent: running", "intake", "http://"+addr.String()+"/v1/events", "server", a.cfg.Server,
		"outbox", a.cfg.OutboxPath, "device_id", a.cfg.DeviceID, "pending", pending, "rejected", rejected)
	if err := g.Wait(); err != nil {
		a.log.Error("postbox agent: stopped", "err", err)
		return err
	}
	at := []any{}
	if pending, rejected, err := a.store.Counts(context.Background()); err == nil {
		at = append(at, "pending", pending, "rejected", rejected) // sent at the next start
	}
	a.log.Info("postbox agent: stopped", at...)
	return nil
}
