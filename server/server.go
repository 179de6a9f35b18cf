// Package server embeds the postbox control plane, what postbox serve runs,
// in a Go program: the store, the ingress, the webhook intake, the HTTP API,
// subscriptions and their workers. A program that embeds it can complete
// the items of an inbox with a Go function instead of an HTTP target:
//
//	srv, err := server.New(server.Config{
//		Addr:     "127.0.0.1:8000",
//		DBPath:   "data/postbox.db",
//		Handlers: map[string]server.Handler{server.WebhookSource: handleWebhook},
//	})
//	...
//	err = srv.Run(ctx) // until ctx ends
//
// A Handler's nil error completes the item; an error is a failed attempt,
// retried with backoff until DeliveryConfig.MaxAttempts, then the item is
// a dead letter. Mark the error with retry.Permanent to dead-letter it at
// once, retry.Transient to retry it without counting the attempt, or
// retry.RetryAfter to wait longer. Handlers must be idempotent: an item is
// handled at least once (Item.EventID is the same on every attempt).
//
// By default events and delivery state live in one SQLite file, DBPath,
// written by its single group-commit writer. Set Config.Streams to run on
// another stream.Backend (Config.Store, the SQL database of delivery
// state, then defaults to the SQLite file). For several servers sharing
// the work (cluster mode), set Config.Store to OpenPostgresStore's store
// and Config.Streams to a backend they all reach (streamnats, streampg).
//
// New refuses a Config it cannot serve with an error that names the field
// at fault ("server: Config.Delivery.Workers must not be negative").
package server

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"net"
	"net/http"

	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/sealed"
	iserver "github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// Sources the server always has: the streams, and the inboxes of their
// default subscriptions, of the ingress's devices and of POST /webhooks.
const (
	DeviceSource  = "devices"
	WebhookSource = "webhooks"
)

// Server is a control plane; Run serves it.
type Server struct {
	srv *iserver.Server
}

// New prepares the server; Run serves it, and closes its stream backend
// and store when it returns (Close closes a server that never ran).
//
// When cfg.Streams is nil, New opens the SQLite file at cfg.DBPath
// (OpenSQLite) and uses it as both Streams and Store. When only cfg.Store
// is nil, the SQLite file holds the delivery state beside cfg.Streams.
// When New fails, it closes what it opened; closing cfg.Streams and
// cfg.Store is left to the caller.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	srv, err := iserver.NewDefault(cfg.internal())
	if err != nil {
		return nil, err
	}
	return &Server{srv: srv}, nil
}

// Run serves until ctx ends, then stops accepting, lets the writer commit
// and answer what it holds, and closes the stream backend and the store.
// It returns an error when the server cannot start, e.g. on an address
// beyond loopback without Config.APIToken or Config.InsecureNoAPIToken.
func (s *Server) Run(ctx context.Context) error { return s.srv.Run(ctx) }

// Listen binds the listener (unless Config.Listener is set) and returns
// its address, for a program that listens on port 0 and needs the port
// before Run. Run calls it if it was not called.
func (s *Server) Listen() (net.Addr, error) { return s.srv.Listen() }

// Handler returns the server's HTTP handler, for tests and for programs
// that mount it on a server of their own (without the connection limits
// Run adds).
func (s *Server) Handler() http.Handler { return s.srv.Handler() }

// Close closes the stream backend and the store. Run closes them when it
// returns; Close is for a server that never ran. It is safe to call more
// than once.
func (s *Server) Close() error { return s.srv.Close() }

// OpenSQLite opens (creating and migrating) the SQLite file at cfg.DBPath
// (DefaultDBPath when empty) with cfg.Synchronous and the writer's bounds
// cfg.MaxBatch, cfg.QueueSize and cfg.QueueBytes: what New uses when
// cfg.Streams or cfg.Store is nil, for wiring that needs the backend
// itself. The server that uses it runs its writer and closes it.
func OpenSQLite(cfg Config) (*streamsqlite.Backend, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return iserver.OpenSQLite(cfg.internal())
}

// PostgresStore keeps delivery state (subscriptions, inbox items, read
// positions and the leases of subscriptions' loops) in a PostgreSQL
// schema that any number of servers share.
type PostgresStore struct {
	s *deliverypg.Store
}

var (
	_ Store = (*PostgresStore)(nil)
	_ Store = (*streamsqlite.Backend)(nil)
)

// OpenPostgresStore connects to the PostgreSQL at url and keeps delivery
// state in schema ("postbox" when empty), created and migrated when a
// server starts on it. Use it as Config.Store of every server, beside a
// Config.Streams they share; the server closes it.
func OpenPostgresStore(ctx context.Context, url, schema string) (*PostgresStore, error) {
	s, err := deliverypg.Open(ctx, deliverypg.Config{URL: url, Schema: schema})
	if err != nil {
		return nil, err
	}
	return &PostgresStore{s: s}, nil
}

// Schema returns the PostgreSQL schema the store keeps its tables in.
func (p *PostgresStore) Schema() string { return p.s.Schema() }

// Close closes the store's connections. A server closes its store when
// it stops.
func (p *PostgresStore) Close() error { return p.s.Close() }

// Update runs fn in a write transaction of the store (Store.Update).
func (p *PostgresStore) Update(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return p.s.Update(ctx, fn)
}

// Migrate applies a component's migrations to the store's schema
// (Store.Migrate).
func (p *PostgresStore) Migrate(ctx context.Context, component string, fsys fs.FS) error {
	return p.s.Migrate(ctx, component, fsys)
}

// ReadDB returns the store's connections for reading (Store.ReadDB).
func (p *PostgresStore) ReadDB() *sql.DB { return p.s.ReadDB() }

// DeliveryStore marks PostgresStore as a Store.
func (p *PostgresStore) DeliveryStore(sealed.Token) {}

// tokens is t as the ingress keeps it: by the hash of each token.
func (t Tokens) internal() ingress.Tokens {
	if t == nil {
		return nil
	}
	out := ingress.Tokens{}
	for token, device := range t {
		out.Add(token, device)
	}
	return out
}

// errorf is an error of New about the Config.
func errorf(format string, args ...any) error {
	return fmt.Errorf("server: "+format, args...)
}
