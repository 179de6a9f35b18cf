package sqlitedb

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The database file's own lock is a flock(2), taken on a descriptor of
// the file that stays open until Unlock:
//
//   - SQLite locks the file with fcntl(2) byte-range locks (POSIX locks).
//     On Linux a flock is another kind of lock, independent of them: it
//     never refuses one of SQLite's, nor is refused by one, whatever
//     bytes they lock. An OFD lock (F_OFD_SETLK) would be of SQLite's
//     kind, and safe only on bytes SQLite never locks (it locks from
//     0x40000000 on, or where SQLITE_PENDING_BYTE says).
//   - A flock belongs to the open file description: a second open of the
//     file in this process is refused like another process (the test of
//     Lock relies on it), and the lock ends when the descriptor is
//     closed, or the process ends, however.
//   - Closing any descriptor of a file drops every POSIX lock the
//     process holds on it: SQLite's. So the descriptor is kept open for
//     the lifetime of the lock, Lock comes before the database is opened
//     and Unlock after it is closed, and a Lock of a file this process
//     holds already is refused from the table below, without opening the
//     file at all.
//
// On NFS, Linux emulates flock with a whole-file POSIX lock, which would
// refuse SQLite's; SQLite's WAL mode needs a local file system anyway
// (its shared memory is a mapped file).

// held is the database files this process holds the lock of, by device
// and inode, with the name each was locked by and its descriptor.
var held = struct {
	sync.Mutex
	files map[fileID]heldFile
}{files: map[fileID]heldFile{}}

type heldFile struct {
	name string
	f    *os.File
}

type fileID struct{ dev, ino uint64 }

func idOf(fi os.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}, true
}

// lockDatabase opens the database file at path, creating it empty if
// there is none (SQLite takes an empty file for an empty database), and
// takes its flock.
func lockDatabase(path string) (*os.File, error) {
	held.Lock()
	defer held.Unlock()
	if fi, err := os.Stat(path); err == nil {
		if id, ok := idOf(fi); ok {
			if h, ok := held.files[id]; ok {
				return nil, fmt.Errorf("%s is %w%s; one process at a time writes it", path, ErrLocked, holderName(path, os.Getpid(), h.name))
			}
		}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		if target, lerr := os.Readlink(path); lerr == nil {
			return nil, fmt.Errorf("lock %s: a symbolic link to %s: %w", path, target, err)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	id, _ := idOf(fi)
	if err := flock(f); err != nil {
		// No SQLite connection of this process is open on the file (it
		// is not in held), so closing f drops none of their locks.
		f.Close()
		if !errors.Is(err, errWouldBlock) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := ""
		if pid := flockHolder(id); pid > 0 {
			holder = holderName(path, pid, openedAs(pid, fi))
		} else {
			holder = lockFileHolder(path) // the kernel did not say: the lock file may
		}
		return nil, fmt.Errorf("%s is %w%s; one process at a time writes it", path, ErrLocked, holder)
	}
	held.files[id] = heldFile{name: path, f: f}
	return f, nil
}

// releaseDatabase closes the database file of a lock, which releases its
// flock.
func releaseDatabase(f *os.File) {
	if f == nil {
		return
	}
	held.Lock()
	defer held.Unlock()
	for id, h := range held.files {
		if h.f == f {
			delete(held.files, id)
		}
	}
	f.Close()
}

// holderName returns " (pid N)", with the name by which the holder
// opened the file when it is another than path: " (pid N, as NAME)".
func holderName(path string, pid int, name string) string {
	if name == "" || sameName(path, name) {
		return fmt.Sprintf(" (pid %d)", pid)
	}
	return fmt.Sprintf(" (pid %d, as %s)", pid, name)
}

// sameName reports whether a and b are one name of the file: the same
// name in the same directory, however the directory is written (the
// kernel writes the directories of a process's files resolved). A
// symbolic link to the file is another name.
func sameName(a, b string) bool {
	abs := func(p string) string {
		dir := filepath.Dir(p)
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			dir = r
		}
		if r, err := filepath.Abs(dir); err == nil {
			dir = r
		}
		return filepath.Join(dir, filepath.Base(p))
	}
	return abs(a) == abs(b)
}

// flockHolder returns the pid of the process holding the flock of the
// file id, read from /proc/locks, or 0 when it cannot tell.
func flockHolder(id fileID) int {
	data, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	// "1: FLOCK  ADVISORY  WRITE 4242 08:02:1311 0 EOF": the device's
	// major and minor numbers in hex, the inode in decimal. Waiters'
	// lines have "->" after the number.
	dev := id.dev
	major := (dev>>8)&0xfff | (dev>>32)&^uint64(0xfff)
	minor := dev&0xff | (dev>>12)&^uint64(0xff)
	want := fmt.Sprintf("%02x:%02x:%d", major, minor, id.ino)
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == want {
			if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
				return pid
			}
		}
	}
	return 0
}

// openedAs returns the name by which process pid has the file fi open,
// from its descriptors in /proc, or "" when they cannot be read (another
// user's process).
func openedAs(pid int, fi os.FileInfo) string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, fd := range fds {
		p := filepath.Join(dir, fd.Name())
		if other, err := os.Stat(p); err == nil && os.SameFile(fi, other) {
			name, err := os.Readlink(p)
			if err == nil && !strings.HasSuffix(name, " (deleted)") {
				return name
			}
		}
	}
	return ""
}
