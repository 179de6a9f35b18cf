package delivery_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// TestSourceSequence: an item carries its event's source sequence number
// and the source's time, and a delivery sends them as
// X-Postbox-Source-Sequence and X-Postbox-Occurred-At; an event without a
// sequence number makes an item whose SourceSequence is nil, sent without
// the header.
func TestSourceSequence(t *testing.T) { eachStore(t, testSourceSequence) }

func testSourceSequence(t *testing.T, kind storeKind) {
	e := setup(t, kind, delivery.Config{})
	tg := newTarget(t, 200)
	e.create(t, delivery.Subscription{Name: "hook", Source: "devices", Target: tg.URL, Start: stream.Start{Policy: stream.StartEarliest}})
	seq := int64(41)
	occurred := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	res, err := e.streams.Append(context.Background(), "devices", []stream.Event{
		{NativeID: "a", Type: "t", OccurredAt: occurred, Sequence: &seq, Metadata: json.RawMessage(`{}`), Payload: json.RawMessage(`{"n":1}`)},
		{NativeID: "b", Type: "t", OccurredAt: occurred.Add(time.Second), Metadata: json.RawMessage(`{}`), Payload: json.RawMessage(`{"n":2}`)},
	})
	if err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("append: %v %+v", err, res)
	}
	var items []delivery.Item
	testenv.Eventually(t, 10*time.Second, "two completed items", func() bool {
		items, err = e.d.List(context.Background(), "hook", delivery.StateCompleted, 0, 10)
		return err == nil && len(items) == 2
	})
	if s := items[0].SourceSequence; s == nil || *s != 41 || !items[0].OccurredAt.Equal(occurred) {
		t.Errorf("item of event a: source sequence %v, occurred at %v; want 41 and %v", s, items[0].OccurredAt, occurred)
	}
	if s := items[1].SourceSequence; s != nil {
		t.Errorf("item of event b (no sequence): source sequence %d, want nil", *s)
	}
	tg.mu.Lock()
	defer tg.mu.Unlock()
	byBody := map[string]int{}
	for i, b := range tg.bodies {
		byBody[b] = i
	}
	ha, hb := tg.headers[byBody[`{"n":1}`]], tg.headers[byBody[`{"n":2}`]]
	if got := ha.Get("X-Postbox-Source-Sequence"); got != "41" {
		t.Errorf("X-Postbox-Source-Sequence of event a = %q, want 41", got)
	}
	if got := ha.Get("X-Postbox-Occurred-At"); got != "2026-01-02T03:04:05.6Z" {
		t.Errorf("X-Postbox-Occurred-At of event a = %q, want 2026-01-02T03:04:05.6Z", got)
	}
	if got, ok := hb["X-Postbox-Source-Sequence"]; ok {
		t.Errorf("event b has no sequence but was sent X-Postbox-Source-Sequence %q", got)
	}
}
