package outbox

import (
	"crypto/rand"
	"sync"

	"github.com/oklog/ulid/v2"
)

var (
	idMu      sync.Mutex
	idEntropy = ulid.Monotonic(rand.Reader, 0)
)

// NewEventID returns a new event id, "evt_" and a ULID: unique, and
// sortable by the time it was made.
func NewEventID() string {
	idMu.Lock()
	defer idMu.Unlock()
	return "evt_" + ulid.MustNew(ulid.Now(), idEntropy).String()
}
