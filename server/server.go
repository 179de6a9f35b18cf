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
package server

import (
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/ingress"
	iserver "github.com/postbox-events/postbox/internal/server"
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

// New opens the store and prepares the server; Run serves it.
func New(cfg Config) (*Server, error) { return iserver.New(cfg) }

// Dead makes a Handler's error final: the item becomes a dead letter
// without further attempts.
func Dead(err error) error { return delivery.Dead(err) }

// RetryAfter makes the next attempt of the item wait at least d.
func RetryAfter(err error, d time.Duration) error { return delivery.RetryAfter(err, d) }
