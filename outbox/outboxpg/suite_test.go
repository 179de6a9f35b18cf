package outboxpg_test

import (
	"context"
	"testing"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the outbox store suite on the transactional outbox,
// filled with InsertPgx in a transaction of the test's, each check on a
// schema of its own, with Run listening for inserts.
func TestSuite(t *testing.T) {
	outboxtest.RunStore(t, outboxtest.StoreFeatures{KeepsDelivered: true}, func(t *testing.T) outboxtest.Store {
		pool, _ := setup(t)
		s, err := outboxpg.New(pool, outboxpg.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		<-s.Notify() // Run notifies once it listens
		insert := func(t *testing.T, events ...outbox.Event) {
			t.Helper()
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if err := outboxpg.InsertPgx(ctx, tx, events...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return outboxtest.Store{Store: s, Admin: s, Insert: insert}
	})
}
