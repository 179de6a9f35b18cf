//go:build !unix

package sqlitedb

import (
	"errors"
	"os"
)

var errWouldBlock = errors.New("would block")

// flock takes nothing where there is no flock.
func flock(*os.File) error { return nil }
