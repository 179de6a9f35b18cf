package streamsqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestWALStartsAnewUnderLoad: while appends never pause, the WAL still
// starts over from its beginning, so its file stays near
// Config.CheckpointPages instead of growing by every page written.
func TestWALStartsAnewUnderLoad(t *testing.T) {
	const pages = 64 // 1 MiB of 16 KiB pages
	b, path := open(t, streamsqlite.Config{CheckpointPages: pages})
	payload := `{"pad":"` + strings.Repeat("x", 2000) + `"}`
	ctx := context.Background()
	written := 0
	for i := range 200 { // ~16 MiB of pages in all, with the table and its index
		evs := make([]stream.Event, 40)
		for j := range evs {
			evs[j] = event(fmt.Sprintf("e%d-%d", i, j), payload)
			written += len(payload)
		}
		if _, err := b.Append(ctx, "devices", evs); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if limit := int64(8 * pages * 16384); fi.Size() > limit {
		t.Fatalf("the WAL is %d bytes after %d bytes of payload, want at most %d: it did not start anew", fi.Size(), written, limit)
	}
}

// TestWALLeftToLitestream: with Config.Checkpoint litestream the store
// checkpoints nothing (neither the writer nor Run's checkpointer), so the
// WAL keeps every page written for Litestream to ship and checkpoint; a
// mode that is neither auto nor litestream is refused, named.
func TestWALLeftToLitestream(t *testing.T) {
	b, path := open(t, streamsqlite.Config{CheckpointPages: 64, Checkpoint: sqlitedb.CheckpointLitestream})
	payload := `{"pad":"` + strings.Repeat("x", 2000) + `"}`
	ctx := context.Background()
	written := 0
	for i := range 200 {
		evs := make([]stream.Event, 40)
		for j := range evs {
			evs[j] = event(fmt.Sprintf("e%d-%d", i, j), payload)
			written += len(payload)
		}
		if _, err := b.Append(ctx, "devices", evs); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < int64(written) {
		t.Fatalf("the WAL is %d bytes after %d bytes of payload: the store checkpointed it, with checkpoints left to Litestream", fi.Size(), written)
	}

	_, err = streamsqlite.Open(filepath.Join(t.TempDir(), "x.db"), streamsqlite.Config{Checkpoint: "never"})
	if err == nil || !strings.Contains(err.Error(), `"never"`) {
		t.Fatalf("Open with Checkpoint never: %v, want an error naming it", err)
	}
}
