//go:build unix

package sqlitedb

import (
	"os"
	"syscall"
)

var errWouldBlock error = syscall.EWOULDBLOCK

// flock takes f's exclusive advisory lock without waiting for it.
func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			return err
		}
	}
}
