package agent

import (
	"crypto/rand"
	"sync"

	"github.com/oklog/ulid/v2"
)

var (
	idMu      sync.Mutex
	idEntropy = ulid.Monotonic(rand.Reader, 0)
)

// newEventID returns a new evt_<ULID>, sortable by time.
func newEventID() string {
	idMu.Lock()
	defer idMu.Unlock()
	return "evt_" + ulid.MustNew(ulid.Now(), idEntropy).String()
}
