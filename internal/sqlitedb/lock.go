package sqlitedb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrLocked is wrapped by the error of a Lock that finds the database's
// lock held by another process (or by another Lock in this one).
var ErrLocked = errors.New("in use by another process")

// FileLock is a lock Lock took; Unlock releases it.
type FileLock struct{ f *os.File }

// Lock takes the exclusive lock of the database at path: an advisory lock
// (flock) on the file path + ".lock". A process whose one writer keeps
// state in memory (the server's next offset of each stream, the agent's
// and the relay's rows in flight) takes it before it opens the database,
// so that a second process started on the same file refuses to start,
// naming the first, instead of failing every write or sending every row
// twice. Other connections (readers, operator commands) take no part:
// SQLite's own locks still order their writes.
//
// The lock belongs to the open file: it ends with the process, however
// that ends (kill -9 too), so no stale lock is ever left. The file holds
// its holder's pid for the error of a Lock that finds it taken. Where
// there is no flock (not unix), Lock takes nothing and succeeds.
func Lock(path string) (*FileLock, error) {
	name := path + ".lock"
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if !errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := ""
		if b, err := os.ReadFile(name); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				holder = fmt.Sprintf(" (pid %d)", pid)
			}
		}
		return nil, fmt.Errorf("%s is %w%s; one process at a time writes it (lock file %s)", path, ErrLocked, holder, name)
	}
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) // for the error above only
	}
	return &FileLock{f: f}, nil
}

// Unlock releases the lock. The lock file stays: removing it would let a
// process that opened it just before hold a lock on a file no one else
// sees. Unlock on a nil FileLock does nothing.
func (l *FileLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the file releases its lock
	l.f = nil
	return err
}
