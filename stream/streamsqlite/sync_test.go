package streamsqlite_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestFullSyncsTheLog: with FULL (the default) every append is answered
// after a sync of the write-ahead log that covered its commit; with
// NORMAL there is no such sync.
func TestFullSyncsTheLog(t *testing.T) {
	for _, mode := range []string{"", sqlitedb.SyncFull, sqlitedb.SyncNormal} {
		t.Run("synchronous="+mode, func(t *testing.T) {
			var mu sync.Mutex
			syncs, covered := 0, 0
			b, _ := open(t, streamsqlite.Config{Synchronous: mode, ObserveSync: func(commits int, _ time.Duration, err error) {
				if err != nil {
					t.Errorf("sync: %v", err)
				}
				mu.Lock()
				syncs++
				covered += commits
				mu.Unlock()
			}})
			var commits int
			b.Observe(func(int, time.Duration, error) { commits++ }) // writer goroutine; read after the appends returned
			for i := range 20 {
				if _, err := b.Append(context.Background(), "devices", []stream.Event{event(string(rune('a'+i)), `{}`)}); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				got := covered
				mu.Unlock()
				if mode != sqlitedb.SyncNormal && got != i+1 {
					t.Fatalf("append %d answered with %d commits synced, want %d", i, got, i+1)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if mode == sqlitedb.SyncNormal && syncs != 0 {
				t.Fatalf("%d syncs with NORMAL, want 0", syncs)
			}
			if mode != sqlitedb.SyncNormal && (syncs == 0 || covered != commits) {
				t.Fatalf("%d syncs covered %d of %d commits", syncs, covered, commits)
			}
		})
	}
}
