package server_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
)

func bigEvent(id string) []stream.Event {
	payload := `{"fill":"` + strings.Repeat("x", 256<<10) + `"}`
	return []stream.Event{{NativeID: id, Type: "t", OccurredAt: time.Now(), Payload: json.RawMessage(payload)}}
}

// TestReadyReportsAFullStore: once the writer's connection may not grow
// the database (SQLite's SQLITE_FULL, as on a full disk), a group commit
// fails and /ready answers 503 with the reason while /health stays 200;
// postbox_store_writable is 0.
func TestReadyReportsAFullStore(t *testing.T) {
	ts := start(t, server.Config{StoreProbeInterval: time.Hour}, nil) // no probe: the failure stays reported
	store := ts.Store()
	ctx := testCtx(t, 30*time.Second)
	if err := store.Update(ctx, func(tx *sql.Tx) error {
		var pages int64
		if err := tx.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Append(ctx, server.DeviceSource, bigEvent("full-1")); err == nil {
		t.Fatal("an append that needs new pages committed on a database that may not grow")
	}
	status, body := call(t, ts, "GET", "/ready", "")
	reason, _ := body["reason"].(string)
	if status != 503 || body["status"] != "store_unwritable" || !strings.Contains(reason, "full") {
		t.Fatalf("/ready while commits fail: %d %v, want 503 store_unwritable with the reason", status, body)
	}
	if status, body := call(t, ts, "GET", "/health", ""); status != 200 {
		t.Errorf("/health while commits fail: %d %v, want 200 (liveness)", status, body)
	}
	if v := metric(t, ts, "postbox_store_writable"); v != 0 {
		t.Errorf("postbox_store_writable = %v while commits fail, want 0", v)
	}
	if v := metric(t, ts, "postbox_writer_failures_total"); v < 1 {
		t.Errorf("postbox_writer_failures_total = %v, want at least 1", v)
	}
}

// TestReadyRecoversWithoutTraffic: while another process holds the
// database's write lock, commits fail and /ready says so; once it lets
// go, the server's probe write commits and /ready answers 200 again,
// with no event sent.
func TestReadyRecoversWithoutTraffic(t *testing.T) {
	ts := start(t, server.Config{StoreProbeInterval: 20 * time.Millisecond}, nil)
	if v := metric(t, ts, "postbox_store_writable"); v != 1 {
		t.Fatalf("postbox_store_writable = %v at start, want 1", v)
	}
	release := lockDB(t, ts.DBPath)
	ctx := testCtx(t, 60*time.Second)
	if _, err := ts.Store().Append(ctx, server.DeviceSource, bigEvent("locked-1")); err == nil {
		t.Fatal("an append committed while another connection held the write lock")
	}
	status, body := call(t, ts, "GET", "/ready", "")
	if status != 503 || body["status"] != "store_unwritable" || !strings.Contains(fmt.Sprint(body["reason"]), "locked") {
		t.Fatalf("/ready while the database is locked: %d %v, want 503 store_unwritable", status, body)
	}
	release()
	waitFor(t, 30*time.Second, "/ready to answer 200 again with no traffic", func() bool {
		status, _ := call(t, ts, "GET", "/ready", "")
		return status == 200
	})
	if v := metric(t, ts, "postbox_store_writable"); v != 1 {
		t.Errorf("postbox_store_writable = %v once a probe committed, want 1", v)
	}
}
