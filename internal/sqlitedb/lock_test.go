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

// TestLockHardLink: the lock is the database file's own, not its name's:
// a Lock by a hard link of a locked database is refused, naming the name
// it is held by, and so is one by a symbolic link. (Two servers on two
// hard links of one file each kept a log of their own beside their name,
// and the file ended malformed.)
func TestLockHardLink(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the database file itself is locked on Linux only; elsewhere the lock file beside its name")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "x.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil { // an empty database
		t.Fatal(err)
	}
	l, err := sqlitedb.Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(dir, "other", "hard.db")
	os.MkdirAll(filepath.Dir(hard), 0o755)
	if err := os.Link(path, hard); err != nil {
		t.Fatal(err)
	}
	soft := filepath.Join(dir, "soft.db")
	if err := os.Symlink("x.db", soft); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{hard, soft} {
		_, err = sqlitedb.Lock(name)
		if want := fmt.Sprintf("%s is in use by another process (pid %d, as %s)", name, os.Getpid(), path); !errors.Is(err, sqlitedb.ErrLocked) || !strings.Contains(err.Error(), want) {
			t.Errorf("Lock of %s: %v, want %v saying %q", name, err, sqlitedb.ErrLocked, want)
		}
	}
	l.Unlock()
	l, err = sqlitedb.Lock(hard)
	if err != nil {
		t.Fatalf("Lock by the hard link once the first is unlocked: %v", err)
	}
	defer l.Unlock()
	if _, err = sqlitedb.Lock(path); !errors.Is(err, sqlitedb.ErrLocked) {
		t.Fatalf("Lock by the first name while the hard link holds it: %v", err)
	}
}

// TestLockSymlink: a database reached by a symbolic link is its target,
// as for SQLite, which keeps the log beside the target: the writer opens,
// commits and syncs its log through the link. A link to a file that
// cannot be made is named with its target.
func TestLockSymlink(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no flock here: Lock takes nothing")
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "data"), 0o755)
	link := filepath.Join(dir, "x.db")
	if err := os.Symlink(filepath.Join("data", "x.db"), link); err != nil {
		t.Fatal(err)
	}
	l, err := sqlitedb.Lock(link)
	if err != nil {
		t.Fatal(err)
	}
	db, wal, err := sqlitedb.OpenWriter(link, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
		t.Fatal(err)
	}
	if err := wal.Sync(); err != nil {
		t.Fatalf("Sync of the log through a symbolic link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "x.db-wal")); err != nil {
		t.Fatalf("the log is not beside the target: %v", err)
	}
	wal.Close()
	db.Close()
	l.Unlock()

	dangling := filepath.Join(dir, "dangling.db")
	os.Symlink(filepath.Join("missing", "y.db"), dangling)
	_, err = sqlitedb.Lock(dangling)
	if want := "lock " + dangling + ": a symbolic link to " + filepath.Join("missing", "y.db"); runtime.GOOS == "linux" && (err == nil || !strings.Contains(err.Error(), want)) {
		t.Fatalf("Lock of a link to a directory that does not exist: %v, want %q", err, want)
	}
}
