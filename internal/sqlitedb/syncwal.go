package sqlitedb

import (
	"fmt"
	"os"
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
	path string // the log: the database's path + "-wal"

	mu sync.Mutex
	f  *os.File
}

// NewWALSyncer returns a WALSyncer for the database at path. The log is
// opened at the first Sync, and again when it is not the file at the path
// any more (the last connection to the database removed it).
func NewWALSyncer(path string) *WALSyncer { return &WALSyncer{path: path + "-wal"} }

// Sync flushes the log to the disk.
func (s *WALSyncer) Sync() error {
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

// Close closes the log's file.
func (s *WALSyncer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
