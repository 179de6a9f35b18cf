package ingress_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/stream"
)

// testSourceGone: while the source is gone (Config.SourceGone answers an
// error), every valid envelope is NACKed retryable with that error, naming
// the source, and nothing is stored; invalid ones keep their own NACK; once
// the source is back the same envelopes are stored.
func testSourceGone(t *testing.T, tr transport) {
	b := sqliteStore(t)
	var gone atomic.Bool
	gone.Store(true)
	in := newIngress(t, b, ingress.Config{SourceGone: func() error {
		if gone.Load() {
			return errors.New(`source "devices" was deleted: it takes no events`)
		}
		return nil
	}})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	f := frame(env("g-1", "pi-1", "t", `{}`), env("g-2", "pi-1", "t", `{}`), `{"event_id":"g-bad"}`)
	send(t, c, f)
	rs := byID(t, replies(t, c, 3))
	for _, id := range []string{"g-1", "g-2"} {
		r := rs[id]
		if r.OK() || r.Code != postbox.CodeUnavailable || !r.Retryable || !strings.Contains(r.Message, `source "devices" was deleted`) {
			t.Errorf("%s while the source is gone: %+v, want a retryable unavailable NACK naming the source", id, r)
		}
		if _, err := b.Lookup(context.Background(), "devices", id, "pi-1"); !errors.Is(err, stream.ErrNotFound) {
			t.Errorf("%s was stored while its source was gone (%v)", id, err)
		}
	}
	if r := rs["g-bad"]; r.OK() || r.Code == postbox.CodeUnavailable {
		t.Errorf("an invalid envelope while the source is gone: %+v, want its own NACK", r)
	}
	gone.Store(false)
	send(t, c, f)
	rs = byID(t, replies(t, c, 3))
	for _, id := range []string{"g-1", "g-2"} {
		if r := rs[id]; !r.OK() || r.Duplicate {
			t.Errorf("%s once the source is back: %+v, want a new ACK", id, r)
		}
	}
}
