//go:build !linux

package sqlitedb

import "os"

// lockDatabase takes nothing but on Linux, where a flock and SQLite's
// fcntl locks are independent of each other. The BSD kernels (macOS's
// among them) keep both kinds in one list of locks per file, where they
// may refuse each other: a flock of the database file could refuse
// SQLite's own locks, of this process and of every reader. That is not
// risked there: only the lock file beside the path is taken, which a hard
// link escapes.
func lockDatabase(string) (*os.File, error) { return nil, nil }

func releaseDatabase(*os.File) {}
