package delivery_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// TestPushDeliveryHandle: a target is sent an item's delivery handle,
// compact, in X-Postbox-Delivery-Handle: the stored one, or a device's
// made from its metadata; an item without either is sent none.
func TestPushDeliveryHandle(t *testing.T) { eachStore(t, testPushDeliveryHandle) }

func testPushDeliveryHandle(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 200)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL + "/in"})
	evs := []stream.Event{
		{NativeID: "gh", Type: "issues", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"headers":{}}`), Payload: json.RawMessage(`{}`),
			DeliveryHandle: json.RawMessage(`{"kind": "github", "url": "https://api.github.com/repos/o/r/issues/1/comments"}`)},
		{NativeID: "dev", Variant: "pi-1", Type: "t", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"device_id":"pi-1","session_id":"s-1","schema_version":1}`),
			Payload: json.RawMessage(`{}`)},
		{NativeID: "none", Type: "t", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"headers":{}}`), Payload: json.RawMessage(`{}`)},
		{NativeID: "uni", Type: "u", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"headers":{}}`), Payload: json.RawMessage(`{}`),
			DeliveryHandle: json.RawMessage(`{"kind":"poll","thread":"Grüße \u007f 😀"}`)},
		{NativeID: "big", Type: "b", OccurredAt: time.Now(), Metadata: json.RawMessage(`{"headers":{}}`), Payload: json.RawMessage(`{}`),
			DeliveryHandle: json.RawMessage(`{"kind":"poll","thread":"` + strings.Repeat("x", 5000) + `"}`)},
	}
	if _, err := e.streams.Append(context.Background(), "devices", evs); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "five pushes", func() bool { return tg.calls() == 5 })
	tg.mu.Lock()
	defer tg.mu.Unlock()
	got := map[string]string{}
	for _, h := range tg.headers {
		vs := h.Values(api.HeaderDeliveryHandle)
		if len(vs) > 1 {
			t.Fatalf("%d handle headers", len(vs))
		}
		got[h.Get("X-Event-Type")+"/"+h.Get("Idempotency-Key")] = h.Get(api.HeaderDeliveryHandle)
	}
	var gh map[string]string
	// A store may keep the members in another order (PostgreSQL's jsonb).
	if err := json.Unmarshal([]byte(got["issues/gh"]), &gh); err != nil || gh["kind"] != "github" || gh["url"] != "https://api.github.com/repos/o/r/issues/1/comments" ||
		strings.Contains(got["issues/gh"], " ") {
		t.Errorf("the github item's header %q, want its handle compact (%v)", got["issues/gh"], err)
	}
	if want := `{"kind":"device","device_id":"pi-1","session_id":"s-1"}`; got["t/pi-1/dev"] != want {
		t.Errorf("the device item's header %q, want %s (all: %v)", got["t/pi-1/dev"], want, got)
	}
	if v, ok := got["t/none"]; !ok || v != "" {
		t.Errorf("the item without a handle: header %q (all: %v)", v, got)
	}
	// In ASCII: what is not, and DEL, escaped; the JSON is the same.
	var uni map[string]string
	if v := got["u/uni"]; strings.ContainsFunc(v, func(r rune) bool { return r >= 0x7f }) || json.Unmarshal([]byte(v), &uni) != nil ||
		uni["thread"] != "Grüße \u007f 😀" {
		t.Errorf("a handle beyond ASCII: header %q, read as %q", v, uni["thread"])
	}
	if v := got["b/big"]; v != "" {
		t.Errorf("a handle of 5 KB: header of %d bytes, want none", len(v))
	}
}
