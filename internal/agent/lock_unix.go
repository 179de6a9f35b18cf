//go:build unix

package agent

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockOutbox takes an exclusive lock beside the outbox file, so that two
// agents never relay one outbox. The lock ends with the process, however it
// ends.
func lockOutbox(path string) (release func(), err error) {
	f, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("agent: lock outbox: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("agent: outbox %s is in use by another agent", path)
		}
		return nil, fmt.Errorf("agent: lock outbox: %w", err)
	}
	return func() { f.Close() }, nil
}
