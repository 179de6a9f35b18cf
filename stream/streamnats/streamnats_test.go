package streamnats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

func open(t testing.TB, cfg streamnats.Config) *streamnats.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := streamnats.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ev(id, payload string) stream.Event {
	return stream.Event{
		NativeID: id, Type: "test.event", OccurredAt: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
		Metadata: json.RawMessage(`{"device_id":"d1"}`), Payload: json.RawMessage(payload),
	}
}

// A redelivery that arrives after JetStream's duplicate window is still a
// duplicate, and with another payload still a conflict.
func TestRedeliveryAfterDuplicateWindow(t *testing.T) {
	const window = 100 * time.Millisecond
	b := open(t, streamnats.Config{URL: natstest.Start(t), DuplicateWindow: window})
	ctx := testContext(t)
	s, err := b.EnsureStream(ctx, "source")
	if err != nil {
		t.Fatal(err)
	}
	first, err := b.Append(ctx, s.ID, []stream.Event{ev("a", `{"n":1}`), ev("b", `{"n":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * window) // the window is wall time: nothing to wait on
	res, err := b.Append(ctx, s.ID, []stream.Event{ev("b", `{"n":2}`), ev("a", `{"n":"other"}`), ev("c", `{"n":3}`)})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[0]; !r.Duplicate || r.Err != nil || r.Offset != 2 || !r.StoredAt.Equal(first[1].StoredAt) {
		t.Errorf("b again after the window: %+v, want Duplicate at offset 2, StoredAt %v", r, first[1].StoredAt)
	}
	if r := res[1]; !errors.Is(r.Err, stream.ErrConflict) || r.Duplicate {
		t.Errorf("a with another payload after the window: %+v, want ErrConflict", r)
	}
	if r := res[2]; r.Duplicate || r.Err != nil || r.Offset != 3 {
		t.Errorf("c: %+v, want new at offset 3", r)
	}
}

// Payloads, ids and metadata come back byte for byte, whatever they hold.
func TestRoundTripsOddBytes(t *testing.T) {
	b := open(t, streamnats.Config{URL: natstest.Start(t)})
	ctx := testContext(t)
	s, err := b.EnsureStream(ctx, "a source/with spaces.and.dots*>%")
	if err != nil {
		t.Fatal(err)
	}
	e := stream.Event{
		NativeID:       " id\r\nwith: newlines %41 and ünïcode ",
		Variant:        "\x00\x7f",
		Type:           "type with spaces ",
		Metadata:       json.RawMessage("{\n  \"pretty\": true\n}"),
		Payload:        json.RawMessage("{ \"spaced\" :  [1,\n2 ] }\n"),
		DeliveryHandle: json.RawMessage(`{"k":"%20"}`),
	}
	if _, err := b.Append(ctx, s.ID, []stream.Event{e}); err != nil {
		t.Fatal(err)
	}
	got, err := b.Lookup(ctx, s.ID, e.NativeID, e.Variant)
	if err != nil {
		t.Fatal(err)
	}
	if got.NativeID != e.NativeID || got.Variant != e.Variant || got.Type != e.Type ||
		string(got.Metadata) != string(e.Metadata) || string(got.Payload) != string(e.Payload) || string(got.DeliveryHandle) != string(e.DeliveryHandle) {
		t.Errorf("got back %+v, want %+v", got.Event, e)
	}
	if r, err := b.Append(ctx, s.ID, []stream.Event{e}); err != nil || !r[0].Duplicate {
		t.Errorf("append again: %+v, %v; want Duplicate", r, err)
	}
	streams, err := b.Streams(ctx)
	if err != nil || len(streams) != 1 || streams[0].ID != s.ID {
		t.Errorf("Streams = %+v, %v; want [%s]", streams, err, s.ID)
	}
}

// TestTooLargeAlone: an event over the NATS server's max_payload is
// refused alone, with ErrTooLarge; the events around it are stored, at
// dense offsets.
func TestTooLargeAlone(t *testing.T) {
	b := open(t, streamnats.Config{URL: natstest.Start(t)})
	ctx := testContext(t)
	s, err := b.EnsureStream(ctx, "source")
	if err != nil {
		t.Fatal(err)
	}
	huge := json.RawMessage(`{"blob":"` + strings.Repeat("a", 2<<20) + `"}`)
	res, err := b.Append(ctx, s.ID, []stream.Event{
		{NativeID: "a", Type: "t", Payload: json.RawMessage(`{}`)},
		{NativeID: "huge", Type: "t", Payload: huge},
		{NativeID: "c", Type: "t", Payload: json.RawMessage(`{}`)},
	})
	if err != nil {
		t.Fatalf("Append with one event over max_payload: %v, want the others stored", err)
	}
	if res[0].Err != nil || res[0].Offset != 1 || res[2].Err != nil || res[2].Offset != 2 {
		t.Errorf("the events around it: %+v and %+v, want offsets 1 and 2", res[0], res[2])
	}
	if !errors.Is(res[1].Err, stream.ErrTooLarge) || !strings.Contains(res[1].Err.Error(), "max_payload") {
		t.Errorf("the huge event: %+v, want ErrTooLarge naming max_payload", res[1])
	}
	if _, err := b.Lookup(ctx, s.ID, "huge", ""); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Lookup(huge) = %v, want ErrNotFound", err)
	}
	if st, err := b.Stats(ctx, s.ID); err != nil || st.Events != 2 || st.LastOffset != 2 {
		t.Errorf("Stats = %+v, %v; want 2 events, last offset 2", st, err)
	}
}

// Trim purges what every consumer read and what is older than t, keeps
// the numbering, and never more than limit.
func TestTrim(t *testing.T) {
	b := open(t, streamnats.Config{URL: natstest.Start(t)})
	ctx := testContext(t)
	s, _ := b.EnsureStream(ctx, "source")
	var evs []stream.Event
	for i := range 10 {
		evs = append(evs, ev(fmt.Sprint(i), `{}`))
	}
	if _, err := b.Append(ctx, s.ID, evs); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "sub", StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Commit(ctx, "sub", 6); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	trim := func(limit, want int) {
		t.Helper()
		n, err := b.Trim(ctx, s.ID, later, limit)
		if err != nil || n != want {
			t.Fatalf("Trim(limit %d) = %d, %v; want %d", limit, n, err, want)
		}
	}
	trim(4, 4)   // 1..4
	trim(100, 2) // 5, 6: the consumer has not read 7
	trim(100, 0)
	if _, err := b.Event(ctx, s.ID, 6); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Event(6) after trim: %v, want ErrNotFound", err)
	}
	st, _ := b.Stats(ctx, s.ID)
	if st.Events != 4 || st.FirstOffset != 7 || st.LastOffset != 10 {
		t.Errorf("Stats after trim = %+v, want 4 events, 7..10", st)
	}
	if err := b.DeleteConsumer(ctx, "sub"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Trim(ctx, s.ID, time.Now().Add(-time.Hour), 100); err != nil || n != 0 {
		t.Errorf("Trim before everything = %d, %v; want 0", n, err)
	}
	trim(100, 4)
	res, err := b.Append(ctx, s.ID, []stream.Event{ev("new", `{}`)})
	if err != nil || res[0].Offset != 11 {
		t.Errorf("append after trimming everything: %+v, %v; want offset 11", res, err)
	}
}

func TestParseURL(t *testing.T) {
	cfg, err := streamnats.ParseURL("nats://u:p@h1:4222,h2:4223?replicas=3&prefix=PB_&duplicate_window=5m&token=x")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.URL != "nats://h1:4222,nats://h2:4223" || cfg.Replicas != 3 || cfg.Prefix != "PB_" || cfg.DuplicateWindow != 5*time.Minute || len(cfg.Options) != 2 {
		t.Errorf("ParseURL = %+v", cfg)
	}
	for _, c := range []struct{ url, names string }{
		{"http://h:1", "nats://"},
		{"nats://h:1?replicas=2", "replicas"},
		{"nats://h:1?bogus=1", "bogus"},
		{"nats://h:1?tls_cert=a", "tls_cert"},
		{"nats://h:1?ack_timeout=soon", "ack_timeout"},
		{"nats://u:secret@h:1?replicas=5", "replicas"},
	} {
		_, err := streamnats.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.names) || strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q) = %v, want an error naming %q (and no password)", c.url, err, c.names)
		}
	}
}

// One node of a 3-node cluster shuts down while writers append: every
// acknowledged event is readable afterwards at its offset, none is stored
// twice, and offsets stay dense.
func TestClusterNodeDownDuringAppends(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster is slow to start; -short skips it")
	}
	c := natstest.StartCluster(t, 3)
	b := open(t, streamnats.Config{URL: c.URL(), Replicas: 3, AckTimeout: 5 * time.Second})
	ctx := testContext(t)
	s, err := b.EnsureStream(ctx, "source")
	if err != nil {
		t.Fatal(err)
	}
	const writers, batches, size = 8, 40, 25
	var mu sync.Mutex
	acked := map[string]int64{} // native id → offset
	var failed int
	var wg sync.WaitGroup
	halfway := make(chan struct{}, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range batches {
				if i == batches/4 {
					halfway <- struct{}{}
				}
				var batch []stream.Event
				for j := range size {
					batch = append(batch, ev(fmt.Sprintf("w%d-%d-%d", w, i, j), fmt.Sprintf(`{"w":%d}`, w)))
				}
				for ctx.Err() == nil { // retry until stored: the retry reports what was as Duplicate
					actx, cancel := context.WithTimeout(ctx, 10*time.Second)
					res, err := b.Append(actx, s.ID, batch)
					cancel()
					if err != nil {
						mu.Lock()
						failed++
						mu.Unlock()
						continue
					}
					mu.Lock()
					for j, r := range res {
						if r.Err != nil {
							t.Errorf("%s: %v", batch[j].NativeID, r.Err)
						}
						if prev, ok := acked[batch[j].NativeID]; ok && prev != r.Offset {
							t.Errorf("%s acked at %d and at %d", batch[j].NativeID, prev, r.Offset)
						}
						acked[batch[j].NativeID] = r.Offset
					}
					mu.Unlock()
					break
				}
			}
		}()
	}
	for range writers {
		<-halfway
	}
	leader := streamLeader(t, ctx, c, streamnats.StreamName(streamnats.DefaultPrefix, s.ID))
	leader.Shutdown()
	wg.Wait()
	t.Logf("%d appends failed and were retried", failed)
	if len(acked) != writers*batches*size {
		t.Fatalf("%d events acknowledged, want %d", len(acked), writers*batches*size)
	}
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "reader", StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	var offsets []int64
	seen := map[string]bool{}
	for from := int64(1); ; {
		batch, err := b.Read(ctx, "reader", from, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch.Events) == 0 {
			break
		}
		for _, e := range batch.Events {
			if seen[e.NativeID] {
				t.Errorf("%s stored twice (again at %d)", e.NativeID, e.Offset)
			}
			seen[e.NativeID] = true
			if want, ok := acked[e.NativeID]; !ok || want != e.Offset {
				t.Errorf("offset %d holds %s, acknowledged at %d", e.Offset, e.NativeID, want)
			}
			offsets = append(offsets, e.Offset)
		}
		from = batch.Events[len(batch.Events)-1].Offset + 1
	}
	if len(offsets) != len(acked) || offsets[0] != 1 || offsets[len(offsets)-1] != int64(len(acked)) || !slices.IsSorted(offsets) {
		t.Errorf("read %d events, offsets %d..%d; want %d dense from 1", len(offsets), offsets[0], offsets[len(offsets)-1], len(acked))
	}
	leader.Restart()
}

// streamLeader returns the node that leads JetStream stream name.
func streamLeader(t *testing.T, ctx context.Context, c *natstest.Cluster, name string) *natstest.Server {
	t.Helper()
	for {
		for _, n := range c.Nodes {
			if srv := n.Server(); srv != nil && srv.JetStreamIsStreamLeader("$G", name) {
				return n
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("stream %s has no leader", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestTrimWhileConsumersCommit: Trim never deletes an event a consumer
// has not read, also while that consumer commits. Listing the consumers
// with a KV watcher missed a key being updated at that moment, and the
// slow consumer's events went with the trim.
func TestTrimWhileConsumersCommit(t *testing.T) {
	b := open(t, streamnats.Config{URL: natstest.Start(t)})
	ctx := testContext(t)
	s, _ := b.EnsureStream(ctx, "source")
	const n = 200
	var evs []stream.Event
	for i := range n {
		evs = append(evs, ev(fmt.Sprint(i), `{}`))
	}
	if _, err := b.Append(ctx, s.ID, evs); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"slow", "done"} {
		if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: id, StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Commit(ctx, "done", n); err != nil {
		t.Fatal(err)
	}
	committed := make(chan error, 1)
	go func() {
		for off := int64(1); off <= n; off++ {
			if _, err := b.Commit(ctx, "slow", off); err != nil {
				committed <- err
				return
			}
		}
		committed <- nil
	}()
	later := time.Now().Add(time.Hour)
	for done := false; !done; {
		select {
		case err := <-committed:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
		if _, err := b.Trim(ctx, s.ID, later, n); err != nil {
			t.Fatal(err)
		}
		// slow's offset only grows: read after the trim, it bounds what
		// the trim may have deleted.
		c, err := b.Consumer(ctx, "slow")
		if err != nil {
			t.Fatal(err)
		}
		st, err := b.Stats(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if first := st.LastOffset - int64(st.Events) + 1; first > c.NextOffset {
			t.Fatalf("trimmed up to offset %d while consumer slow is at %d: it lost events it had not read", first-1, c.NextOffset)
		}
	}
}
