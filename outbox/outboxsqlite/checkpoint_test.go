package outboxsqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestCheckpointMode: with Config.Checkpoint auto (or none) the writer
// checkpoints the log itself from checkpointPages and the idle
// checkpoint truncates it; with litestream the writer's automatic
// checkpoints are off and the idle checkpoint leaves the log as it is,
// for Litestream, whose read transaction a truncating checkpoint would
// wait on. A mode that is neither is refused, named.
func TestCheckpointMode(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		autoPages int
		truncates bool
	}{
		{"", checkpointPages, true},
		{sqlitedb.CheckpointAuto, checkpointPages, true},
		{sqlitedb.CheckpointLitestream, 0, false},
	} {
		t.Run("mode="+tc.mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			s, err := Open(path, Config{Checkpoint: tc.mode})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var pages int
			if err := s.db.QueryRow(`PRAGMA wal_autocheckpoint`).Scan(&pages); err != nil {
				t.Fatal(err)
			}
			if pages != tc.autoPages {
				t.Errorf("the writer's wal_autocheckpoint is %d, want %d", pages, tc.autoPages)
			}
			before := walSize(t, path)
			if before == 0 {
				t.Fatal("the migrations left no log to checkpoint")
			}
			if err := s.truncateWAL(context.Background()); err != nil {
				t.Fatal(err)
			}
			after := walSize(t, path)
			if truncated := after == 0; truncated != tc.truncates {
				t.Errorf("the log was %d bytes, %d after the idle checkpoint; truncated %v, want %v", before, after, truncated, tc.truncates)
			}
		})
	}
	if _, err := Open(filepath.Join(t.TempDir(), "x.db"), Config{Checkpoint: "never"}); err == nil || !strings.Contains(err.Error(), `"never"`) {
		t.Fatalf("Open with Checkpoint never: %v, want an error naming it", err)
	}
}
