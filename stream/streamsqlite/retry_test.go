package streamsqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/powercut"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// TestWriterRetriesIOErrors: a group commit whose writes fail with EIO (a
// disk's hiccup, injected by the filesystem under the database) is tried
// again, and its appends succeed, stored once; a failure that outlasts the
// retries reaches the caller, and the next append after it succeeds.
func TestWriterRetriesIOErrors(t *testing.T) {
	if os.Getenv("POSTBOX_TEST_FUSE_RETRY") == "" {
		// On 2026-11-29 this test hung, intermittently, in CI and by hand:
		// the process serves the FUSE file system it writes through, and a
		// thread blocked in the kernel on a write to it outlived the test
		// (a defunct process, the mount left behind). Until that is found,
		// it runs on request only.
		t.Skip("hangs intermittently (a FUSE self-deadlock, under investigation); set POSTBOX_TEST_FUSE_RETRY=1 to run it")
	}
	pc := powercut.Mount(t)
	r := start(t, filepath.Join(pc.Dir(), "postbox.db"), streamsqlite.Config{})
	t.Cleanup(func() { r.Close() })
	b := r.Backend
	ctx := context.Background()
	if _, err := b.EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []int
	b.ObserveRetry(func(_, attempt int, _ time.Duration, err error) {
		mu.Lock()
		attempts = append(attempts, attempt)
		mu.Unlock()
	})
	retried := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return append([]int(nil), attempts...)
	}
	if _, err := b.Append(ctx, "devices", []stream.Event{event("before", `{}`)}); err != nil {
		t.Fatal(err)
	}

	pc.FailWrites(2)
	res, err := b.Append(ctx, "devices", []stream.Event{event("hiccup-1", `{"n":1}`), event("hiccup-2", `{"n":2}`)})
	if err != nil || res[0].Err != nil || res[1].Err != nil || res[0].Duplicate {
		t.Fatalf("append during a hiccup of two failed writes: %+v %v, want stored", res, err)
	}
	if got := retried(); len(got) == 0 || got[0] != 2 {
		t.Fatalf("retries %v, want the group commit tried again", got)
	}

	pc.FailWrites(1 << 20)
	start := time.Now()
	if _, err := b.Append(ctx, "devices", []stream.Event{event("outage", `{}`)}); err == nil {
		t.Fatal("append while every write fails: stored, want the error")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the error took %v to reach the caller, want the retries' budget (about 1.5 s)", took)
	}
	if got := retried(); got[len(got)-1] != 5 {
		t.Errorf("retries %v, want the last before giving up to be attempt 5", got)
	}
	pc.FailWrites(0)
	if _, err := b.Append(ctx, "devices", []stream.Event{event("after", `{}`)}); err != nil {
		t.Fatalf("append once the disk recovered: %v", err)
	}
	evs, err := b.ReadFrom(ctx, "devices", 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.NativeID)
	}
	if fmt.Sprint(ids) != "[before hiccup-1 hiccup-2 after]" {
		t.Fatalf("stored %v, want each appended event once and not the refused one", ids)
	}
}
