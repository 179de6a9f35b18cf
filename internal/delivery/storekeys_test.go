package delivery_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
)

// TestKey: a store's key of a name is made once, kept across a restart,
// and differs from name to name and from store to store.
func TestKey(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		ctx := context.Background()
		streams := filepath.Join(t.TempDir(), "p.db")
		e := open(t, kind, openOptions{streams: streams})
		k1, err := e.d.Key(ctx, "fingerprints")
		if err != nil || len(k1) != 32 {
			t.Fatalf("Key: %x, %v", k1, err)
		}
		other, _ := e.d.Key(ctx, "other")
		if bytes.Equal(k1, other) {
			t.Fatal("two names have one key")
		}
		e.stop()
		e = open(t, kind, openOptions{streams: streams, state: e.stateAt})
		if again, err := e.d.Key(ctx, "fingerprints"); err != nil || !bytes.Equal(again, k1) {
			t.Fatalf("Key after a restart: %x, %v; want %x", again, err, k1)
		}
		if fresh, _ := open(t, kind, openOptions{}).d.Key(ctx, "fingerprints"); bytes.Equal(fresh, k1) {
			t.Fatal("two stores have one key")
		}
	})
}
