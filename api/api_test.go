package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/api"
)

// TestUpdateSubscriptionJSON: a patch sends what it sets, null for what
// it resets and for an empty target, and nothing else.
func TestUpdateSubscriptionJSON(t *testing.T) {
	url, none, timeout, conc, skip := "https://example.com/hook", "", "5s", 4, "skip"
	for _, c := range []struct {
		name string
		u    api.UpdateSubscription
		want string
	}{
		{"nothing", api.UpdateSubscription{}, `{}`},
		{"target", api.UpdateSubscription{Target: &url}, `{"target":"https://example.com/hook"}`},
		{"no target", api.UpdateSubscription{Target: &none}, `{"target":null}`},
		{"settings", api.UpdateSubscription{EndpointSettings: api.EndpointSettings{Timeout: &timeout, Concurrency: &conc}},
			`{"concurrency":4,"timeout":"5s"}`},
		{"on_dead_letter", api.UpdateSubscription{OnDeadLetter: &skip}, `{"on_dead_letter":"skip"}`},
		{"reset", api.UpdateSubscription{EndpointSettings: api.EndpointSettings{Timeout: &timeout}, Reset: []string{"secret", "rate"}},
			`{"rate":null,"secret":null,"timeout":"5s"}`},
	} {
		b, err := json.Marshal(c.u)
		if err != nil || string(b) != c.want {
			t.Errorf("%s: %s %v, want %s", c.name, b, err, c.want)
		}
	}
	_, err := json.Marshal(api.UpdateSubscription{EndpointSettings: api.EndpointSettings{Timeout: &timeout}, Reset: []string{"timeout"}})
	if err == nil || !strings.Contains(err.Error(), "timeout is both set and reset") {
		t.Errorf("set and reset: %v, want an error naming timeout", err)
	}
}

// TestItemRoundTrip: an item decodes and encodes to the same JSON, null
// times and raw payloads included.
func TestItemRoundTrip(t *testing.T) {
	in := `{"id":7,"inbox":"planner","subscription":"planner","stream":"devices","offset":3,"stream_event_id":"devices/3",` +
		`"event_id":"evt-1","type":"t","occurred_at":"2026-11-21T10:00:00Z","source_sequence":null,"stored_at":"2026-11-21T10:00:01Z",` +
		`"metadata":{"device_id":"pi-7"},"payload":{"a":[1,2]},"delivery_handle":null,"state":"processing","attempts":1,` +
		`"next_attempt_at":"2026-11-21T10:00:01Z","lease_expires_at":"2026-11-21T10:00:31Z","last_error":null,` +
		`"created_at":"2026-11-21T10:00:01Z","updated_at":"2026-11-21T10:00:01Z","failed_at":null,"replayed_at":null,"replays":0,"last_error_past":false,"order_key":"o-1"}`
	var it api.Item
	if err := json.Unmarshal([]byte(in), &it); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(it)
	if err != nil || string(out) != in {
		t.Fatalf("round trip:\n%s\nwant\n%s", out, in)
	}
}
