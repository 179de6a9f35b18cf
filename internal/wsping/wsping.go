// Package wsping keeps a WebSocket connection honest: it pings the peer at
// an interval and reports the first ping not answered in time, so that a
// peer that vanished without closing (power loss, a dead NAT entry) is
// noticed instead of holding the connection forever.
//
// A pong is read by the connection's reader, behind the frames the peer
// sent before it. When the reader is held back by its own side (a full
// write queue, a memory bound), a pong cannot be seen, and that is not the
// peer's fault: the reader reports such stalls in a Stalls, and Run does
// not hold a ping that went unanswered during one against the peer.
package wsping

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Defaults for Run.
const (
	DefaultInterval = 20 * time.Second
	DefaultTimeout  = 10 * time.Second
)

// Stalls records when a connection's reader stops reading for reasons of
// its own side. The zero value is ready to use; Begin and End pair up.
type Stalls struct {
	mu  sync.Mutex
	n   int    // stalls in progress
	seq uint64 // counts Begins
}

// Begin marks the reader as held back by its own side.
func (s *Stalls) Begin() {
	s.mu.Lock()
	s.n++
	s.seq++
	s.mu.Unlock()
}

// End ends a stall begun with Begin.
func (s *Stalls) End() {
	s.mu.Lock()
	s.n--
	s.mu.Unlock()
}

// mark returns a point to compare with since.
func (s *Stalls) mark() uint64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq
}

// since reports whether the reader stalled at any time after mark: it is
// stalled now or began a stall since.
func (s *Stalls) since(mark uint64) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n > 0 || s.seq != mark
}

// Run pings c every interval until ctx ends (returning nil) or a ping is
// not answered within timeout (returning an error). The connection must
// have a reader running: pongs are read by it.
func Run(ctx context.Context, c *websocket.Conn, interval, timeout time.Duration) error {
	return RunStalls(ctx, c, interval, timeout, nil)
}

// RunStalls is Run for a reader that reports its own stalls in stalls: a
// ping unanswered while the reader stalled is not an error, the peer is
// pinged again at the next interval.
func RunStalls(ctx context.Context, c *websocket.Conn, interval, timeout time.Duration, stalls *Stalls) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		mark := stalls.mark()
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil && !stalls.since(mark) {
			return fmt.Errorf("peer did not answer a ping within %s: %w", timeout, err)
		}
	}
}
