package sqlitedb_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestLock: a second Lock of a database is refused, naming the database
// and the holder's pid, until the first is unlocked; other databases are
// not affected.
func TestLock(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no flock here: Lock takes nothing")
	}
	path := filepath.Join(t.TempDir(), "sub", "x.db")
	l, err := sqlitedb.Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sqlitedb.Lock(path)
	if pid := fmt.Sprintf("(pid %d)", os.Getpid()); !errors.Is(err, sqlitedb.ErrLocked) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), pid) {
		t.Fatalf("second Lock: %v, want %v naming %s and %s", err, sqlitedb.ErrLocked, path, pid)
	}
	other, err := sqlitedb.Lock(path + "2")
	if err != nil {
		t.Fatalf("another database: %v", err)
	}
	other.Unlock()
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	again, err := sqlitedb.Lock(path)
	if err != nil {
		t.Fatalf("Lock after Unlock: %v", err)
	}
	again.Unlock()
	var none *sqlitedb.FileLock
	if err := none.Unlock(); err != nil {
		t.Fatal(err)
	}
}
