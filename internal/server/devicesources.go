package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/intake"
)

// deviceSources are the device sources besides the default one (devices)
// that a connection to the ingress names (?source=NAME, as postbox relay
// --source does), so that the events of several services are kept, and
// subscribed to, by origin. Each has a gate, as the default has, so that
// the frames of one deleted while connected are refused.
type deviceSources struct {
	log *slog.Logger
	st  atomic.Pointer[intake.Store] // set once the store is open

	mu    sync.Mutex
	gates map[string]*intake.Gate
}

func newDeviceSources(log *slog.Logger) *deviceSources {
	return &deviceSources{log: log, gates: map[string]*intake.Gate{}}
}

// Use makes the sources read from st.
func (d *deviceSources) Use(st *intake.Store) { d.st.Store(st) }

// resolve returns the stream of the device source name and the check of
// its frames (ingress.Config.Source).
func (d *deviceSources) resolve(ctx context.Context, name string) (string, func() error, error) {
	st := d.st.Load()
	if st == nil {
		return "", nil, errors.New("the server is starting: its sources are not read yet")
	}
	src, err := st.Source(ctx, name)
	switch {
	case errors.Is(err, intake.ErrNotFound):
		return "", nil, fmt.Errorf("source %q: %w: create it with postbox sources create %s --kind device", name, ingress.ErrNoSource, name)
	case err != nil:
		return "", nil, fmt.Errorf("source %q: %w", name, err)
	case src.Kind != intake.KindDevice:
		return "", nil, fmt.Errorf("source %q is a %s source: %w (postbox sources create NAME --kind device)", name, src.Kind, ingress.ErrNoSource)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gates[name]
	if g == nil {
		g = intake.NewGate(name, sourceCacheTTL, d.log)
		g.Use(st)
		g.Arm() // it exists now: missing later, it was deleted
		d.gates[name] = g
	}
	return src.Stream, g.Check, nil
}

// forget makes the gate of name read its source again (created or
// deleted).
func (d *deviceSources) forget(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g := d.gates[name]; g != nil {
		g.Forget()
	}
}
