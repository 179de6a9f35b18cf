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
type FileLock struct {
	db *os.File // the database file itself, where it is locked (Linux)
	f  *os.File // the lock file beside the path
}

// Lock takes the exclusive lock of the database at path. A process whose
// one writer keeps state in memory (the server's next offset of each
// stream, the agent's and the relay's rows in flight) takes it before it
// opens the database, so that a second process started on the same file
// refuses to start, naming the first, instead of failing every write or
// sending every row twice. Other connections (readers, operator commands)
// take no part: SQLite's own locks still order their writes.
//
// On Linux the lock is on the database file itself (its inode, see
// lockDatabase), so a second process that reaches the file by another
// name, a hard link or a symbolic link, is refused too: SQLite keeps its
// log and shared memory beside the name it was given, so two writers on
// two hard links of one file do not see each other's commits, and the
// file ends malformed. A symbolic link is followed, as SQLite follows it:
// the target is the database, locked and logged beside. Everywhere
// with flock there is also an advisory lock (flock) on the file
// path + ".lock", as before: a postbox of an earlier version takes only
// that one, so an old and a new process on one path still refuse each
// other. It holds its holder's pid, for the error of a Lock that finds it
// taken.
//
// The locks belong to open files: they end with the process, however
// that ends (kill -9 too), so no stale lock is ever left. Where there is
// no flock (not unix), Lock takes nothing and succeeds.
//
// Take the lock before the database is opened in this process, and
// release it after every connection to it is closed: closing a descriptor
// of the database file drops the POSIX locks the process holds on it,
// SQLite's own (see lockDatabase).
func Lock(path string) (*FileLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	db, err := lockDatabase(path)
	if err != nil {
		return nil, err
	}
	f, err := lockFile(path)
	if err != nil {
		releaseDatabase(db)
		return nil, err
	}
	return &FileLock{db: db, f: f}, nil
}

// lockFile takes the flock of path + ".lock" and writes the process's pid
// in it.
func lockFile(path string) (*os.File, error) {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := flock(f); err != nil {
		f.Close()
		if !errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return nil, fmt.Errorf("%s is %w%s; one process at a time writes it (lock file %s)", path, ErrLocked, lockFileHolder(path), name)
	}
	if f.Truncate(0) == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) // for the errors above only
	}
	return f, nil
}

// lockFileHolder returns " (pid N)" naming the process whose pid the lock
// file of path holds, or "" if it holds none.
func lockFileHolder(path string) string {
	b, err := os.ReadFile(path + ".lock")
	if err != nil {
		return ""
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return ""
}

// Unlock releases the lock. The lock file stays: removing it would let a
// process that opened it just before hold a lock on a file no one else
// sees. Unlock on a nil FileLock does nothing.
func (l *FileLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the file releases its lock
	releaseDatabase(l.db)
	l.f, l.db = nil, nil
	return err
}
