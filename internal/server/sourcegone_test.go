package server_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
)

// TestDeletedDeviceSource: once the devices source is deleted, device
// events over the WebSocket and over gRPC are NACKed (retryable,
// unavailable, naming the source) and nothing is stored; created again, it
// takes them.
func TestDeletedDeviceSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, server.Config{GRPCListener: ln}, nil)
	urls := map[string]string{"websocket": ts.WS, "grpc": "grpc://" + ln.Addr().String()}
	if status, v := call(t, ts, "DELETE", "/v1/sources/devices", ""); status != 204 {
		t.Fatalf("delete devices: %d %v", status, v)
	}
	for name, url := range urls {
		c := dial(t, url, client.Options{})
		r := send(t, c, message(t, envelope("evt_gone_"+name, "pi-1", `{}`)))[0]
		if r.OK() || r.Code != postbox.CodeUnavailable || !r.Retryable || !strings.Contains(r.Message, `source "devices" was deleted`) {
			t.Errorf("%s: an event for the deleted source: %+v, want a retryable unavailable NACK naming the source", name, r)
		}
		if n := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE source_native_id = ?`, "evt_gone_"+name); n != 0 {
			t.Errorf("%s: the event was stored %d times while its source was deleted", name, n)
		}
	}
	if status, v := call(t, ts, "POST", "/v1/sources", `{"name": "devices", "kind": "device"}`); status != 201 {
		t.Fatalf("create devices again: %d %v", status, v)
	}
	for name, url := range urls {
		c := dial(t, url, client.Options{})
		var r postbox.Reply
		waitFor(t, 10*time.Second, name+": the event stored", func() bool {
			r = send(t, c, message(t, envelope("evt_gone_"+name, "pi-1", `{}`)))[0]
			return r.OK()
		})
	}
}
