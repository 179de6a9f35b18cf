package sqlitedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
)

// PartialSuffix ends the name of a snapshot being written. A file so
// named is never a complete backup: Backup renames it to its final name
// only after it is written and synced.
const PartialSuffix = ".partial"

// File returns the path of the main database file of db, and false when
// db is not a SQLite database (a PostgreSQL store) or is in memory.
func File(ctx context.Context, db *sql.DB) (string, bool) {
	if _, ok := db.Driver().(*sqlite.Driver); !ok {
		return "", false
	}
	var seq int
	var name, file string
	if err := db.QueryRowContext(ctx, "PRAGMA database_list").Scan(&seq, &name, &file); err != nil || file == "" {
		return "", false
	}
	return file, true
}

// openExisting opens the existing SQLite file at path with one
// connection and none of Open's pragmas but busy_timeout: it neither
// creates the file nor changes its journal mode. ro makes the connection
// read-only.
func openExisting(path string, ro bool) (*sql.DB, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory, not a database file", path)
	}
	mode := "rw"
	if ro {
		mode = "ro"
	}
	q := url.Values{}
	q.Add("mode", mode)
	q.Add("_pragma", "busy_timeout(5000)")
	db, err := sql.Open("sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// OpenReadOnly opens the existing SQLite file at path for reading, for
// an inspection of a backup or of a database in use; it never creates
// the file or changes it.
func OpenReadOnly(path string) (*sql.DB, error) {
	db, err := openExisting(path, true)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return db, nil
}

// Snapshot writes a consistent copy of the SQLite database at path to
// the file tmp, which must not exist or be empty, and syncs it to the
// disk. The database may be in use by other connections and processes,
// writers included: the copy is SQLite's online backup, page by page,
// inside one read transaction of the source, which holds no lock that
// stops a writer in WAL mode (a checkpoint cannot pass it while it
// runs, so the WAL grows by what is written meanwhile); it holds what was
// committed when it began, WAL included. It copies snapshotStep pages
// at a time, so other work gets the disk between steps. progress, when
// not nil, is called every progressEvery with the bytes copied so far
// and the bytes to copy in all.
func Snapshot(ctx context.Context, path, tmp string, progress func(copied, total int64)) error {
	db, err := openExisting(path, false)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	defer conn.Close()
	// The read transaction pins the snapshot for every step: no step
	// sees another connection's commit, so the copy never restarts.
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	var pageSize int64
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(new(int)); err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	// The copy is written without a journal of its own: it is nothing
	// until Backup renames it, and it is synced before.
	dst := "file:" + (&url.URL{Path: tmp}).EscapedPath() + "?_pragma=journal_mode(OFF)&_pragma=synchronous(OFF)"
	err = conn.Raw(func(dc any) error {
		bc, ok := dc.(interface {
			NewBackup(string) (*sqlite.Backup, error)
		})
		if !ok {
			return fmt.Errorf("the driver's connection %T has no online backup", dc)
		}
		b, err := bc.NewBackup(dst)
		if err != nil {
			return err
		}
		last := time.Now()
		for {
			more, err := b.Step(snapshotStep)
			if err != nil {
				b.Finish()
				return err
			}
			if !more {
				break
			}
			if err := ctx.Err(); err != nil {
				b.Finish()
				return err
			}
			if progress != nil && time.Since(last) >= progressEvery {
				last = time.Now()
				total := int64(b.PageCount())
				progress((total-int64(b.Remaining()))*pageSize, total*pageSize)
			}
		}
		return b.Finish()
	})
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("snapshot %s: %w", path, err)
	}
	// The pages are the source's, its header too: bytes 18 and 19 say
	// WAL mode. Set them to rollback mode (1), as PRAGMA journal_mode =
	// DELETE would, so that reading the copy creates no -wal and -shm
	// files beside it; whoever opens it to write sets the mode they use.
	_, err = f.WriteAt([]byte{1, 1}, 18)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("snapshot %s: sync %s: %w", path, tmp, err)
	}
	return nil
}

// snapshotStep is how many pages Snapshot copies at a time (4 MiB of
// 4 KiB pages).
const snapshotStep = 1024

// progressEvery is how often Snapshot reports its progress.
const progressEvery = 2 * time.Second

// Backup writes a consistent snapshot of the SQLite database at path
// (see Snapshot) to the file to, atomically: it is written to a
// temporary file beside to, named to + ".*" + PartialSuffix, synced, and
// renamed to to only when complete, so that a backup killed halfway
// leaves no file at to, only a partial one, which the next Backup to the
// same name removes. A partial file is locked while it is written, so a
// Backup never removes the one another is writing. An existing file at
// to is replaced, under its lock (see Lock): a database a process has
// open is not replaced under it (ErrLocked).
func Backup(ctx context.Context, path, to string, progress func(copied, total int64)) error {
	dir, base := filepath.Dir(to), filepath.Base(to)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("backup to %s: %w", to, err)
	}
	if _, err := os.Stat(to); err == nil {
		lock, err := Lock(to)
		if err != nil {
			return fmt.Errorf("backup to %s: %w", to, err)
		}
		defer lock.Unlock()
	}
	removeStalePartials(dir, base)
	f, err := os.CreateTemp(dir, base+".*"+PartialSuffix)
	if err != nil {
		return fmt.Errorf("backup to %s: %w", to, err)
	}
	tmp := f.Name()
	// The flock tells a later Backup the file is being written; it ends
	// with the process, however that ends. f stays open until the copy
	// is over: closing a descriptor of the file would drop the POSIX
	// locks SQLite holds on it.
	flock(f)
	defer f.Close()
	if err := Snapshot(ctx, path, tmp, progress); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := removeLogs(to); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup to %s: %w", to, err)
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("backup to %s: %w", to, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("backup to %s: %w", to, err)
	}
	return nil
}

// SnapshotFile writes a snapshot of the database at path (see Snapshot)
// to a new file beside it, named "." + its name + ".snapshot-*" +
// PartialSuffix, and returns it open at its start, for the caller to
// send, close and remove. The file is locked while it is open; the next
// SnapshotFile removes those a process killed while it sent one left
// behind.
func SnapshotFile(ctx context.Context, path string) (*os.File, error) {
	dir, base := filepath.Dir(path), "."+filepath.Base(path)+".snapshot"
	removeStalePartials(dir, base)
	f, err := os.CreateTemp(dir, base+".*"+PartialSuffix)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", path, err)
	}
	flock(f)
	if err := Snapshot(ctx, path, f.Name(), nil); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// removeStalePartials removes the partial files of earlier backups to
// base in dir that no process is writing (whose flock it can take).
func removeStalePartials(dir, base string) {
	names, _ := filepath.Glob(filepath.Join(dir, globEscape(base)+".*"+PartialSuffix))
	for _, name := range names {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if err := flock(f); err == nil {
			os.Remove(name)
			os.Remove(name + "-journal") // should SQLite have written one
		}
		f.Close()
	}
}

// globEscape escapes the pattern characters of s for filepath.Glob.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(s)
}

// SyncDir syncs the directory dir, so that a rename or a file created in
// it survives a power cut.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}

// IntegrityCheck runs PRAGMA integrity_check on db and returns nil when
// it answers ok, else an error with its first findings.
func IntegrityCheck(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, "PRAGMA integrity_check(10)")
	if err != nil {
		return fmt.Errorf("integrity check: %w", err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return fmt.Errorf("integrity check: %w", err)
		}
		found = append(found, s)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("integrity check: %w", err)
	}
	if len(found) == 1 && found[0] == "ok" {
		return nil
	}
	return fmt.Errorf("integrity check failed: %s", strings.Join(found, "; "))
}

// ErrExists is wrapped by the error of a Restore that finds a database
// at its target and was not told to replace it.
var ErrExists = errors.New("exists")

// Restore puts the snapshot from (a file Backup wrote) in place as the
// database at to; check it first (IntegrityCheck). It takes the lock of
// to (see Lock: a process that has it open refuses the restore,
// ErrLocked), refuses an existing database at to unless replace is set
// (ErrExists), copies the snapshot beside to, syncs it, removes the log
// files of the database it replaces (to + "-wal", "-shm", "-journal",
// which SQLite would otherwise apply to the restored file) and renames
// the copy to to.
func Restore(from, to string, replace bool) (err error) {
	if same(from, to) {
		return fmt.Errorf("restore from %s: it is the target database itself", from)
	}
	if hasLog(from) {
		// The copy takes the main file alone: what is in its log would
		// be left out.
		return fmt.Errorf("restore from %s: it has a write-ahead log or journal beside it, which a restore would leave out: take a backup of it with postbox backup and restore that", from)
	}
	fi, statErr := os.Stat(to)
	exists := statErr == nil && (fi.Size() > 0 || hasLog(to))
	lock, err := Lock(to)
	if err != nil {
		return fmt.Errorf("restore to %s: %w", to, err)
	}
	defer lock.Unlock()
	if statErr != nil {
		// Lock made to, empty: a restore that fails leaves nothing a
		// server would start on as a new database.
		defer func() {
			if err != nil {
				os.Remove(to)
			}
		}()
	}
	if exists && !replace {
		return fmt.Errorf("restore to %s: a database %w there", to, ErrExists)
	}
	dir, base := filepath.Dir(to), filepath.Base(to)
	in, err := os.Open(from)
	if err != nil {
		return fmt.Errorf("restore from %s: %w", from, err)
	}
	defer in.Close()
	out, err := os.CreateTemp(dir, base+".*"+PartialSuffix)
	if err != nil {
		return fmt.Errorf("restore to %s: %w", to, err)
	}
	tmp := out.Name()
	mode := os.FileMode(0o644) // as Lock creates a database
	if exists {
		mode = fi.Mode().Perm()
	}
	err = out.Chmod(mode)
	if err == nil {
		_, err = out.ReadFrom(in)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore to %s: copy: %w", to, err)
	}
	if err := removeLogs(to); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore to %s: %w", to, err)
	}
	if err := os.Rename(tmp, to); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore to %s: %w", to, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("restore to %s: %w", to, err)
	}
	return nil
}

// removeLogs removes the WAL, shared memory and rollback journal of the
// database at path, before another file takes its name: SQLite would
// apply a WAL left beside it to the new file.
func removeLogs(path string) error {
	for _, suffix := range []string{"-wal", "-shm", "-journal"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the old database's log: %w", err)
		}
	}
	return nil
}

// hasLog reports whether the database at path has a WAL or rollback
// journal beside it (an empty main file may still hold data in its WAL).
func hasLog(path string) bool {
	for _, suffix := range []string{"-wal", "-journal"} {
		if fi, err := os.Stat(path + suffix); err == nil && fi.Size() > 0 {
			return true
		}
	}
	return false
}

// same reports whether a and b name one existing file.
func same(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
