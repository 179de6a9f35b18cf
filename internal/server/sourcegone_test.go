package server_test

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
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

// TestNamedDeviceSource: a connection naming a device source (WebSocket
// ?source=, gRPC metadata, client.Options.Source) stores its events in
// that source's stream, not in devices; one naming no source, or a source
// of another kind, is refused as not found; deleted, the source's events
// are NACKed as unavailable, as the default's are.
func TestNamedDeviceSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, server.Config{GRPCListener: ln}, nil)
	urls := map[string]string{"websocket": ts.WS, "grpc": "grpc://" + ln.Addr().String()}
	for name, url := range urls {
		for _, src := range []string{"billing", "webhooks"} {
			_, err := client.Dial(t.Context(), url, client.Options{Source: src})
			if ae, ok := errors.AsType[*client.APIError](err); !ok || ae.Code != api.CodeNotFound || !strings.Contains(ae.Message, `source "`+src+`"`) {
				t.Errorf("%s: dial with source %s, which is no device source: %v, want a not_found refusal naming it", name, src, err)
			}
		}
	}
	if status, v := call(t, ts, "POST", "/v1/sources", `{"name": "billing", "kind": "device"}`); status != 201 || v["stream"] != "billing" {
		t.Fatalf("create the device source billing: %d %v", status, v)
	}
	for name, url := range urls {
		c := dial(t, url, client.Options{Source: "billing"})
		if r := send(t, c, message(t, envelope("evt_billing_"+name, "svc-1", `{}`)))[0]; !r.OK() {
			t.Fatalf("%s: an event for billing: %+v", name, r)
		}
		if n := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE stream_id = 'billing' AND source_native_id = ?`, "evt_billing_"+name); n != 1 {
			t.Errorf("%s: the event is %d times in the stream billing, want 1", name, n)
		}
		if n := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE stream_id = 'devices'`); n != 0 {
			t.Errorf("%s: %d events in devices, want none", name, n)
		}
		if status, v := call(t, ts, "DELETE", "/v1/sources/billing", ""); status != 204 {
			t.Fatalf("delete billing: %d %v", status, v)
		}
		r := send(t, c, message(t, envelope("evt_billing_gone_"+name, "svc-1", `{}`)))[0]
		if r.OK() || r.Code != postbox.CodeUnavailable || !r.Retryable || !strings.Contains(r.Message, `source "billing" was deleted`) {
			t.Errorf("%s: an event for the deleted billing: %+v, want a retryable unavailable NACK naming it", name, r)
		}
		if status, v := call(t, ts, "POST", "/v1/sources", `{"name": "billing", "kind": "device"}`); status != 201 {
			t.Fatalf("create billing again: %d %v", status, v)
		}
	}
}
