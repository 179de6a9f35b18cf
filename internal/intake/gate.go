package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Gate answers the ingress's question whether its source still takes
// events (ingress.Config.SourceGone): a source deleted with
// DELETE /v1/sources/{name} takes none until it is created again, over
// the WebSocket and gRPC alike.
//
// The gate is open until the server has made its default sources (Arm):
// on a new store the device source does not exist for the first moments,
// and a device that connects then is not refused. It is open too until
// it has a store to read (Use). What it read is kept for its TTL; this
// node's own deletes and creates take effect at once (Forget). It runs on
// every frame's read path, so one caller reads the store while the
// others take the last answer.
type Gate struct {
	source string
	ttl    time.Duration
	log    *slog.Logger
	st     atomic.Pointer[Store] // set once the store is open

	armed   atomic.Bool
	state   atomic.Pointer[gateState] // the last answer; nil: read it
	reading sync.Mutex                // held by the one caller reading the store
}

// gateState is an answer of the store and when it was read.
type gateState struct {
	err error
	at  time.Time
}

// NewGate returns the gate of source, which keeps what it read for ttl
// (0: reads the store on every check).
// A nil log discards.
func NewGate(source string, ttl time.Duration, log *slog.Logger) *Gate {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{source: source, ttl: ttl, log: log}
}

// Use makes the gate read the source from st.
func (g *Gate) Use(st *Store) { g.st.Store(st) }

// Arm closes the gate to events of the source once the server made its
// default sources: from then on a missing source was deleted.
func (g *Gate) Arm() {
	g.armed.Store(true)
	g.Forget()
}

// Check returns an error naming the source when it was deleted.
func (g *Gate) Check() error {
	if !g.armed.Load() {
		return nil
	}
	st := g.state.Load()
	if st != nil && time.Since(st.at) < g.ttl {
		return st.err
	}
	if st != nil && !g.reading.TryLock() {
		return st.err // another caller is reading; its answer comes soon
	}
	if st == nil {
		g.reading.Lock() // after Forget: every caller waits for the new answer
		if st = g.state.Load(); st != nil {
			g.reading.Unlock()
			return st.err
		}
	}
	defer g.reading.Unlock()
	return g.read(st).err
}

// read asks the store whether the source exists and keeps the answer.
// A store that cannot say leaves last (nil: open) in place.
func (g *Gate) read(last *gateState) *gateState {
	next := &gateState{at: time.Now()}
	if last != nil {
		next.err = last.err
	}
	if st := g.st.Load(); st != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := st.Source(ctx, g.source)
		cancel()
		switch {
		case errors.Is(err, ErrNotFound):
			next.err = fmt.Errorf("source %q was deleted: postbox stores no events of it until it is created again (postbox sources create %s --kind device)", g.source, g.source)
		case err != nil:
			// The store cannot say: keep the last answer, which the append
			// will meet the same store failure after anyway.
			g.log.Warn("ingress: reading the source failed; its last state holds", "source", g.source, "err", err)
		default:
			next.err = nil
		}
	}
	g.state.Store(next)
	return next
}

// Forget makes the next Check read the source again.
func (g *Gate) Forget() {
	g.state.Store(nil)
}
