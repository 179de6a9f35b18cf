package main_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestServeConnectionsPerAddress: --ws-max-connections-per-address bounds
// one address's connections without a token, and 0 turns the bound off.
func TestServeConnectionsPerAddress(t *testing.T) {
	for _, tc := range []struct {
		bound   string
		refused bool
	}{{"1", true}, {"0", false}} {
		addr := freePort(t)
		p := start(t, "serve", "--addr", addr, "--db", t.TempDir()+"/pb.db", "--ws-max-connections-per-address", tc.bound)
		waitHTTP(t, "http://"+addr+"/ready", p)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		first, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer first.CloseNow()
		second, resp, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", nil)
		if err == nil {
			defer second.CloseNow()
		}
		switch {
		case tc.refused && (resp == nil || resp.StatusCode != http.StatusServiceUnavailable):
			t.Errorf("bound %s: second connection from one address: %v, want 503", tc.bound, err)
		case !tc.refused && err != nil:
			t.Errorf("bound %s: second connection from one address: %v, want it admitted", tc.bound, err)
		}
	}
}
