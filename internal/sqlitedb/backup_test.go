package sqlitedb_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// newDB makes a SQLite database at path holding one row.
func newDB(t *testing.T, path string) {
	t.Helper()
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('kept')`); err != nil {
		t.Fatal(err)
	}
}

// TestBackupDoesNotReplaceADatabaseInUse: a backup onto a database a
// process has open is refused and leaves it as it was.
func TestBackupDoesNotReplaceADatabaseInUse(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no flock here: Lock takes nothing")
	}
	dir := t.TempDir()
	src, live := filepath.Join(dir, "src.db"), filepath.Join(dir, "live.db")
	newDB(t, src)
	newDB(t, live)
	lock, err := sqlitedb.Lock(live)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	before, _ := os.ReadFile(live)
	err = sqlitedb.Backup(context.Background(), src, live, nil)
	if !errors.Is(err, sqlitedb.ErrLocked) {
		t.Fatalf("a backup onto a database in use: %v, want %v", err, sqlitedb.ErrLocked)
	}
	if after, _ := os.ReadFile(live); string(after) != string(before) {
		t.Fatal("the database in use was changed")
	}
	lock.Unlock()
	if err := sqlitedb.Backup(context.Background(), src, live, nil); err != nil {
		t.Fatalf("a backup onto a database no one has open: %v", err)
	}
}

// TestRestoreRefusesASourceWithALog: a file whose write-ahead log holds
// part of it is not restored by copying the file alone, and a refused
// restore leaves no empty database behind.
func TestRestoreRefusesASourceWithALog(t *testing.T) {
	dir := t.TempDir()
	src, to := filepath.Join(dir, "src.db"), filepath.Join(dir, "restored.db")
	newDB(t, src)
	if err := os.WriteFile(src+"-wal", []byte("frames"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := sqlitedb.Restore(src, to, false)
	if err == nil || !strings.Contains(err.Error(), "write-ahead log") {
		t.Fatalf("restore from a file with a WAL: %v, want a refusal naming its log", err)
	}
	if _, err := os.Stat(to); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore left %s: %v", to, err)
	}
}
