package delivery_test

import (
	"bytes"
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
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

// TestClaimDigest: a digest claimed by one key is that key's for the
// window, whoever else claims it, also at once; the same key claims it
// again; after the window the next key takes it; sources are apart.
func TestClaimDigest(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		ctx := context.Background()
		e := open(t, kind, openOptions{})
		claim := func(source, digest, key string) string {
			t.Helper()
			owner, err := e.d.ClaimDigest(ctx, source, digest, key, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return owner
		}
		if got := claim("gh", "d1", "delivery-1"); got != "delivery-1" {
			t.Fatalf("first claim: owner %q", got)
		}
		if got := claim("gh", "d1", "delivery-1"); got != "delivery-1" {
			t.Fatalf("the same key again: owner %q", got)
		}
		if got := claim("gh", "d1", "replay-1"); got != "delivery-1" {
			t.Fatalf("another key within the window: owner %q, want delivery-1", got)
		}
		if got := claim("gh2", "d1", "replay-1"); got != "replay-1" {
			t.Fatalf("another source: owner %q", got)
		}
		owners := make([]string, 8)
		var wg sync.WaitGroup
		for i := range owners {
			wg.Go(func() { owners[i] = claim("gh", "d2", string(rune('a'+i))) })
		}
		wg.Wait()
		for _, o := range owners {
			if o != owners[0] {
				t.Fatalf("claims at once: owners %q, want one", owners)
			}
		}
		e.clock.Advance(time.Hour + time.Second)
		if got := claim("gh", "d1", "later-1"); got != "later-1" {
			t.Fatalf("after the window: owner %q, want later-1", got)
		}
		// Claims delete expired rows (d2's and gh2's d1 expired).
		if n := e.count(t, `SELECT COUNT(*) FROM webhook_digests WHERE expires_at <= ?`, e.clock.Now().Format("2006-01-02T15:04:05.000000Z")); n != 0 {
			t.Fatalf("%d expired rows left after a claim", n)
		}
	})
}
