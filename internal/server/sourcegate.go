package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
)

// sourceGate answers the ingress's question whether its source still
// takes events (ingress.Config.SourceGone): a source deleted with
// DELETE /v1/sources/{name} takes none until it is created again, over
// the WebSocket and gRPC alike. What it read is kept for sourceCacheTTL;
// this node's own deletes and creates take effect at once (forget).
type sourceGate struct {
	source string
	d      atomic.Pointer[delivery.Delivery] // set once delivery is open; nil: open
	log    *slog.Logger

	mu  sync.Mutex
	err error     // the answer read at at
	at  time.Time // zero: read again
}

// check returns an error naming the source when it was deleted.
func (g *sourceGate) check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.at) < sourceCacheTTL {
		return g.err
	}
	d := g.d.Load()
	if d == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := d.Source(ctx, g.source)
	switch {
	case errors.Is(err, delivery.ErrNotFound):
		g.err = fmt.Errorf("source %q was deleted: postbox stores no events of it until it is created again (postbox sources create %s --kind device)", g.source, g.source)
	case err != nil:
		// The store cannot say: keep the last answer, which the append
		// will meet the same store failure after anyway.
		g.log.Warn("ingress: reading the source failed; its last state holds", "source", g.source, "err", err)
	default:
		g.err = nil
	}
	g.at = time.Now()
	return g.err
}

// forget makes the next check read the source again.
func (g *sourceGate) forget() {
	g.mu.Lock()
	g.at = time.Time{}
	g.mu.Unlock()
}
