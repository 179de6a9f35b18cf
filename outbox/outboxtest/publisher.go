package outboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-events/postbox/outbox"
)

// PublisherFeatures declares where a publisher differs from the others;
// the zero value is a publisher that delivers at least once.
type PublisherFeatures struct {
	// Dedups: the receiver drops an event sent again with an id it holds
	// (JetStream's duplicate window, a postbox server's idempotent
	// append), so the same batch published twice is held once.
	Dedups bool
}

// Received is one event as the receiver holds it.
type Received struct {
	EventID string
	Type    string
	Payload json.RawMessage // the event's payload JSON
}

// Target is a publisher to a receiver of its own, opened for one check.
type Target struct {
	Publisher outbox.Publisher
	// ReadBack returns every event the receiver holds, in any order. It
	// is called only after every publish was ACKed.
	ReadBack func(t *testing.T) []Received
}

// NewTarget opens a Target for one check, and closes it when t ends. The
// publisher takes messages as every outbox.Store hands them out (Body is
// the event's payload).
type NewTarget func(t *testing.T) Target

// RunPublisher runs the publisher suite as subtests of t.
func RunPublisher(t *testing.T, f PublisherFeatures, newTarget NewTarget) {
	for _, c := range []struct {
		name string
		run  func(*pubHarness)
	}{
		{"batch_acked_in_order_and_held_once", testPublishBatch},
		{"same_batch_again", testPublishAgain},
		{"empty_batch", testPublishEmpty},
		{"large_batch", testPublishLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			c.run(&pubHarness{T: t, ctx: ctx, f: f, tg: newTarget(t)})
		})
	}
}

type pubHarness struct {
	*testing.T
	ctx context.Context
	f   PublisherFeatures
	tg  Target
}

func messages(prefix string, n int) []outbox.Message {
	created := time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)
	out := make([]outbox.Message, n)
	for i := range out {
		id := fmt.Sprintf("%s-%04d", prefix, i+1)
		out[i] = outbox.Message{Seq: int64(i + 1), EventID: id, Type: "order.created",
			Body:          []byte(`{"order":"` + id + `","n":` + fmt.Sprint(i) + `}`),
			CorrelationID: "corr-" + id, TenantID: "acme", CreatedAt: created.Add(time.Duration(i) * time.Millisecond)}
	}
	return out
}

// publish publishes msgs and fails the test unless each is ACKed, in order.
func (h *pubHarness) publish(msgs []outbox.Message) {
	h.Helper()
	replies, err := h.tg.Publisher.Publish(h.ctx, msgs)
	if err != nil {
		h.Fatalf("Publish: %v", err)
	}
	if len(replies) != len(msgs) {
		h.Fatalf("%d replies to %d messages", len(replies), len(msgs))
	}
	for i, r := range replies {
		if r.EventID != msgs[i].EventID || !r.OK() {
			h.Fatalf("reply %d to %s: %+v", i, msgs[i].EventID, r)
		}
	}
}

// readBack checks that the receiver holds msgs, each at least once and
// at most max times, and nothing else.
func (h *pubHarness) readBack(msgs []outbox.Message, max int) {
	h.Helper()
	got := h.tg.ReadBack(h.T)
	want := map[string]outbox.Message{}
	for _, m := range msgs {
		want[m.EventID] = m
	}
	seen := map[string]int{}
	for _, r := range got {
		m, ok := want[r.EventID]
		if !ok {
			h.Fatalf("the receiver holds %q, never published", r.EventID)
		}
		if r.Type != m.Type {
			h.Fatalf("%s: type %q, want %q", r.EventID, r.Type, m.Type)
		}
		if !sameJSON(r.Payload, m.Body) {
			h.Fatalf("%s: payload %s, want %s", r.EventID, r.Payload, m.Body)
		}
		seen[r.EventID]++
	}
	for _, m := range msgs {
		if n := seen[m.EventID]; n < 1 || n > max {
			h.Fatalf("the receiver holds %s %d times, want 1 to %d", m.EventID, n, max)
		}
	}
}

func testPublishBatch(h *pubHarness) {
	msgs := messages("batch", 5)
	h.publish(msgs)
	h.readBack(msgs, 1)
}

func testPublishAgain(h *pubHarness) {
	msgs := messages("again", 5)
	h.publish(msgs)
	h.publish(msgs)
	if h.f.Dedups {
		h.readBack(msgs, 1)
	} else {
		h.readBack(msgs, 2)
	}
}

func testPublishEmpty(h *pubHarness) {
	replies, err := h.tg.Publisher.Publish(h.ctx, nil)
	if err != nil || len(replies) != 0 {
		h.Fatalf("Publish(nil): %v, %v", replies, err)
	}
	h.readBack(nil, 0)
}

func testPublishLarge(h *pubHarness) {
	msgs := messages("large", 1000)
	h.publish(msgs)
	h.readBack(msgs, 1)
}
