// Package wsping keeps a WebSocket connection honest: it pings the peer at
// an interval and reports the first ping not answered in time, so that a
// peer that vanished without closing (power loss, a dead NAT entry) is
// noticed instead of holding the connection forever.
package wsping

import (
	"context"
	"fmt"
	"time"

	"github.com/coder/websocket"
)

// Defaults for Run.
const (
	DefaultInterval = 20 * time.Second
	DefaultTimeout  = 10 * time.Second
)

// Run pings c every interval until ctx ends (returning nil) or a ping is
// not answered within timeout (returning an error). The connection must
// have a reader running: pongs are read by it.
func Run(ctx context.Context, c *websocket.Conn, interval, timeout time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Ping(pctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("peer did not answer a ping within %s: %w", timeout, err)
		}
	}
}
