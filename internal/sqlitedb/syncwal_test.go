package sqlitedb_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestWALSyncer syncs a database's log.
func TestWALSyncer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sqlitedb.Open(path, sqlitedb.Options{Synchronous: sqlitedb.SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	s := sqlitedb.NewWALSyncer(path)
	defer s.Close()
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// TestWALSyncerNoLog: without a log there is nothing to sync, and Sync
// says which file is missing.
func TestWALSyncerNoLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.db")
	s := sqlitedb.NewWALSyncer(path)
	defer s.Close()
	err := s.Sync()
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "none.db-wal") {
		t.Fatalf("Sync without a log = %v, want an error naming none.db-wal", err)
	}
}

// TestOpenWriter: with FULL, or no mode, the writer's connection commits
// as NORMAL (1) and a WALSyncer syncs its log; with NORMAL there is no
// WALSyncer, and its Sync does nothing.
func TestOpenWriter(t *testing.T) {
	for mode, want := range map[string]bool{"": true, sqlitedb.SyncFull: true, sqlitedb.SyncNormal: false} {
		path := filepath.Join(t.TempDir(), "w.db")
		db, wal, err := sqlitedb.OpenWriter(path, sqlitedb.Options{Synchronous: mode})
		if err != nil {
			t.Fatal(err)
		}
		_, sync, _, err := sqlitedb.Pragmas(context.Background(), db)
		if err != nil || sync != 1 {
			t.Errorf("synchronous=%q: the connection has synchronous=%d (%v), want 1 (NORMAL)", mode, sync, err)
		}
		if (wal != nil) != want {
			t.Errorf("synchronous=%q: WALSyncer %v, want one: %v", mode, wal, want)
		}
		if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
			t.Fatal(err)
		}
		if err := wal.Sync(); err != nil {
			t.Errorf("synchronous=%q: Sync: %v", mode, err)
		}
		wal.Close()
		db.Close()
	}
}
