package sqlitedb_test

import (
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
