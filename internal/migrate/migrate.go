// Package migrate plans a component's embedded SQL migrations: which
// files there are, in what order they apply, and which of them a
// database that reached a given version has not applied yet. The
// appliers, internal/sqlitedb for SQLite and internal/pgmigrate for
// PostgreSQL, run the plan each in their own transactions and record the
// version each component reached.
//
// A database that records a version above the last migration, written by
// a newer postbox, is refused (Check): nothing may be applied to it.
//
// A migration is a file named NNNN_what.sql; its number is its version.
// Files apply in the order of their names, which must be the order of
// their numbers (the same width for every number).
package migrate

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/postbox-events/postbox/internal/buildinfo"
)

// Migration is one migration file.
type Migration struct {
	Version int    // the number its name starts with
	Name    string // the file's name, e.g. 0003_positions.sql
	SQL     string // the file's contents
}

// ErrNoFiles is returned by Read for a directory without *.sql files.
var ErrNoFiles = errors.New("no *.sql files")

// Read returns the *.sql files of fsys in the order they apply. It
// returns ErrNoFiles when there are none, and an error naming the file
// when a name does not start with a number, or its number is another
// file's or lower than the file's before it.
func Read(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, ErrNoFiles
	}
	sort.Strings(names)
	all := make([]Migration, 0, len(names))
	for i, name := range names {
		n, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("%s: name must start with a number", name)
		}
		if i > 0 {
			switch prev := all[i-1]; {
			case n == prev.Version:
				return nil, fmt.Errorf("%s: number %d is also %s's", name, n, prev.Name)
			case n < prev.Version:
				return nil, fmt.Errorf("%s: number %d sorts after %s's %d: give every number the same width", name, n, prev.Name, prev.Version)
			}
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		all = append(all, Migration{Version: n, Name: name, SQL: string(body)})
	}
	return all, nil
}

// Pending returns the migrations of all, in order, that a database at
// version current has not applied: those with a greater version.
func Pending(all []Migration, current int) []Migration {
	var out []Migration
	for _, m := range all {
		if m.Version > current {
			out = append(out, m)
		}
	}
	return out
}

// Latest returns the version of the last migration of all, 0 for none:
// the highest this binary knows.
func Latest(all []Migration) int {
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].Version
}

// TooNewError is the error of Check for a database a newer postbox
// wrote: a component's recorded version is above the last migration this
// binary embeds. Nothing may be applied to such a database.
type TooNewError struct {
	Component string // streams, delivery, intake, outbox ...
	Have      int    // the version the database records
	Know      int    // the highest version this binary embeds
}

func (e *TooNewError) Error() string {
	return fmt.Sprintf("database holds %s schema %d; this postbox (%s) knows up to %d: "+
		"it was written by a newer postbox; use that version or restore a backup",
		e.Component, e.Have, binaryVersion(), e.Know)
}

// binaryVersion is this binary's version, for TooNewError.
var binaryVersion = func() string { return buildinfo.Get().Version }

// Check returns a *TooNewError when current, the version a database
// records for component, is above the last migration of all.
func Check(component string, all []Migration, current int) error {
	if latest := Latest(all); current > latest {
		return &TooNewError{Component: component, Have: current, Know: latest}
	}
	return nil
}
