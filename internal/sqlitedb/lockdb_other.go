//go:build !linux

package sqlitedb

import "os"

// lockDatabase takes nothing but on Linux, where a flock and SQLite's
// fcntl locks are independent of each other. FreeBSD's flock(2) says the
// two kinds see each other (the other BSD kernels and macOS's come from
// the same code): a flock of the database file would refuse SQLite's own
// locks, of this process and of every reader. Only the lock file beside
// the path is taken there, which a hard link escapes.
func lockDatabase(string) (*os.File, error) { return nil, nil }

func releaseDatabase(*os.File) {}
