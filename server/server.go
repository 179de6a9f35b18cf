// Package server embeds the postbox control plane, what postbox serve runs,
// in a Go program: the store, the ingress, the webhook intake, the HTTP API,
// subscriptions and their workers. A program that embeds it can complete
// the items of an inbox with a Go function instead of an HTTP target:
//
//	srv, err := server.New(server.Config{
//		Addr:     "127.0.0.1:8000",
//		DBPath:   "data/postbox.db",
//		Handlers: map[string]server.Handler{"webhooks": handleWebhook},
//	})
//	...
//	err = srv.Run(ctx) // until ctx ends
//
// A Handler's nil error completes the item; an error is a failed attempt,
// retried with backoff until Delivery.MaxAttempts, then the item is a dead
// letter. Wrap the error with Dead to dead-letter it at once, or with
// RetryAfter to wait longer. Handlers must be idempotent: an item is
// handled at least once (Item.EventID is the same on every attempt).
//
// By default events and delivery state live in one SQLite file, DBPath,
// written by its single group-commit writer. Set Config.Streams to run on
// another stream.Backend (Config.Store, the SQL database of delivery
// state, then defaults to the SQLite file). For several servers sharing
// the work (cluster mode), set Config.Store to OpenPostgresStore's store
// and Config.Streams to a backend they all reach (streamnats, streampg).
package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/ingress"
	iserver "github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

type (
	// Config configures a Server; see the fields' documentation. The zero
	// value serves on :8000 with data/postbox.db.
	Config = iserver.Config
	// WebhookConfig configures POST /webhooks.
	WebhookConfig = iserver.WebhookConfig
	// DeliveryConfig configures workers, retries, dead letters and
	// retention (Config.Delivery).
	DeliveryConfig = delivery.Config
	// Server is a control plane; Run serves it.
	Server = iserver.Server
	// Handler completes one inbox item.
	Handler = delivery.Handler
	// Item is an inbox item: the event, its state and attempts.
	Item = delivery.Item
	// Tokens maps the ingress's bearer tokens to devices (Config.Tokens);
	// add them with Tokens.Add.
	Tokens = ingress.Tokens
)

// Sources the server always has.
const (
	DeviceSource  = iserver.DeviceSource
	WebhookSource = iserver.WebhookSource
)

// DefaultDBPath is where the SQLite file is when Config.DBPath is empty.
const DefaultDBPath = iserver.DefaultDBPath

// New prepares the server; Run serves it, and closes its stream backend
// and store when it returns (Server.Close closes a server that never ran).
//
// When cfg.Streams is nil, New opens the SQLite file at cfg.DBPath
// (OpenSQLite) and uses it as both Streams and Store. When only cfg.Store
// is nil, the SQLite file holds the delivery state beside cfg.Streams.
func New(cfg Config) (*Server, error) {
	var opened *streamsqlite.Backend
	if cfg.Streams == nil || cfg.Store == nil {
		db, err := OpenSQLite(cfg)
		if err != nil {
			return nil, err
		}
		opened = db
		if cfg.Streams == nil {
			if cfg.Store != nil {
				db.Close()
				return nil, errors.New("server: Config.Store without Config.Streams: set both, or Streams alone, or neither (SQLite for both); " +
					"servers sharing a PostgreSQL store need streams they share too")
			}
			cfg.Streams = db
		}
		cfg.Store = db
	}
	srv, err := iserver.New(cfg)
	if err != nil && opened != nil {
		opened.Close()
	}
	return srv, err
}

// OpenSQLite opens (creating and migrating) the SQLite file at cfg.DBPath
// (DefaultDBPath when empty) with cfg.Synchronous and the writer's bounds
// cfg.MaxBatch, cfg.QueueSize and cfg.QueueBytes: what New uses when
// cfg.Streams or cfg.Store is nil, for wiring that needs the backend
// itself. The server that uses it runs its writer and closes it.
func OpenSQLite(cfg Config) (*streamsqlite.Backend, error) {
	if cfg.DBPath == "" {
		cfg.DBPath = DefaultDBPath
	}
	db, err := streamsqlite.Open(cfg.DBPath, streamsqlite.Config{
		Synchronous: cfg.Synchronous,
		MaxBatch:    cfg.MaxBatch,
		QueueSize:   cfg.QueueSize,
		QueueBytes:  cfg.QueueBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return db, nil
}

// PostgresStore keeps delivery state (subscriptions, inbox items, read
// positions and the leases of subscriptions' loops) in a PostgreSQL
// schema that any number of servers share.
type PostgresStore = deliverypg.Store

// OpenPostgresStore connects to the PostgreSQL at url and keeps delivery
// state in schema ("postbox" when empty), created and migrated when a
// server starts on it. Use it as Config.Store of every server, beside a
// Config.Streams they share; the server closes it.
func OpenPostgresStore(ctx context.Context, url, schema string) (*PostgresStore, error) {
	return deliverypg.Open(ctx, deliverypg.Config{URL: url, Schema: schema})
}

// Dead makes a Handler's error final: the item becomes a dead letter
// without further attempts.
func Dead(err error) error { return delivery.Dead(err) }

// RetryAfter makes the next attempt of the item wait at least d.
func RetryAfter(err error, d time.Duration) error { return delivery.RetryAfter(err, d) }
