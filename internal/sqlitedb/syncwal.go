package sqlitedb

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// WALSyncer makes durable what a connection opened with synchronous=NORMAL
// committed to a database in WAL mode: Sync flushes the database's
// write-ahead log to the disk (fdatasync on Linux, fsync elsewhere).
//
// A commit in WAL mode appends the transaction's pages and a commit frame
// to the log; with synchronous=FULL SQLite then syncs the log before the
// commit returns, with NORMAL it does not. A sync of the log after the
// commit returned, before anyone is told, gives that commit the guarantee
// FULL gives, and one sync covers every commit before it. SQLite still
// syncs the log's header when it starts the log anew and the log before
// each checkpoint copies it into the database file, in NORMAL as in FULL.
type WALSyncer struct {
	db string // the database's path

	mu   sync.Mutex
	path string // the log, beside the database file: its path + "-wal"
	f    *os.File
}

// OpenWriter opens the one writer connection of a group-committed store
// at path (opts.MaxConns is 1). With synchronous FULL, or none given, the
// connection commits as NORMAL does and the WALSyncer returned makes its
// commits durable: the group commit's Sync, and a call after any other
// write on the connection. With NORMAL the WALSyncer is nil, and its Sync
// does nothing.
func OpenWriter(path string, opts Options) (*sql.DB, *WALSyncer, error) {
	var wal *WALSyncer
	if mode := strings.ToUpper(opts.Synchronous); mode == "" || mode == SyncFull {
		opts.Synchronous, wal = SyncNormal, NewWALSyncer(path)
	}
	opts.MaxConns = 1
	db, err := Open(path, opts)
	if err != nil {
		return nil, nil, err
	}
	return db, wal, nil
}

// NewWALSyncer returns a WALSyncer for the database at path. The log is
// opened at the first Sync, and again when it is not the file at the path
// any more (the last connection to the database removed it). A symbolic
// link is followed, as SQLite follows it: the log is beside the target.
func NewWALSyncer(path string) *WALSyncer { return &WALSyncer{db: path} }

// Sync flushes the log to the disk. On a nil WALSyncer (NORMAL) it does
// nothing.
func (s *WALSyncer) Sync() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f != nil {
		if fi, err := os.Stat(s.path); err == nil {
			if cur, err := s.f.Stat(); err != nil || !os.SameFile(fi, cur) {
				s.f.Close()
				s.f = nil
			}
		}
	}
	if s.f == nil {
		s.path = s.db + "-wal"
		if target, err := filepath.EvalSymlinks(s.db); err == nil {
			s.path = target + "-wal"
		}
		f, err := os.Open(s.path)
		if err != nil {
			return fmt.Errorf("sync %s: %w", s.path, err)
		}
		s.f = f
	}
	if err := datasync(s.f); err != nil {
		return fmt.Errorf("sync %s: %w", s.path, err)
	}
	return nil
}

// Close closes the log's file. A nil WALSyncer has none.
func (s *WALSyncer) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
