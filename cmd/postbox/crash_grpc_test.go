package main_test

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestCrashServerGRPC kills the control plane with SIGKILL at random
// moments while agents stream events to its gRPC ingress, restarts it, and
// counts every event: each one stored once.
func TestCrashServerGRPC(t *testing.T) {
	crashRunOn(t, 3, []string{"--grpc-addr", freePort(t)}, nil, func(srv *proc, srvURL string, _ map[string]*proc) {
		srv.kill()
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
		srv.restart()
		waitHTTP(t, srvURL+"/ready", srv)
	}, nil, checkStored)
}
