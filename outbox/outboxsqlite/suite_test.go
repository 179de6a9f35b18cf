package outboxsqlite_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the outbox store suite on the edge outbox, filled the
// way the agent fills it: envelopes through Store.Insert. Due hands out
// the payload and the envelope's fields, as every store does.
func TestSuite(t *testing.T) {
	outboxtest.RunStore(t, outboxtest.StoreFeatures{CompactsPayload: true}, func(t *testing.T) outboxtest.Store {
		s, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			<-done
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
		insert := func(t *testing.T, events ...outbox.Event) {
			t.Helper()
			envs := make([]postbox.Envelope, len(events))
			for i, e := range events {
				if err := e.Prepare(); err != nil {
					t.Fatal(err)
				}
				m := outbox.Message{EventID: e.ID, Type: e.Type, Body: e.Payload, CorrelationID: e.CorrelationID, TenantID: e.TenantID, CreatedAt: time.Now(),
					TraceParent: e.TraceParent, TraceState: e.TraceState}
				envs[i] = m.Envelope()
			}
			res, err := s.Insert(context.Background(), envs)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil || r.Duplicate {
					t.Fatalf("insert %s: %+v", r.EventID, r)
				}
			}
		}
		return outboxtest.Store{Store: s, Admin: s, Insert: insert}
	})
}
