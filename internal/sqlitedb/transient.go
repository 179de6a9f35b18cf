package sqlitedb

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Transient reports whether err is SQLite failing for a reason that may
// pass when the transaction runs again: an I/O error, a hiccup of the
// disk. A database busy or locked ("database is locked") is not: SQLite's
// busy handler has already waited busy_timeout (5 s) for it, trying again
// and again, before it failed. A full disk is not either: it lasts until
// someone frees space.
func Transient(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_IOERR
}
