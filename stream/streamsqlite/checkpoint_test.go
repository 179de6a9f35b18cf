package streamsqlite_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

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
