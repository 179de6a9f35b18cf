package streamkafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

func testEvent(id string) stream.Event {
	return stream.Event{
		NativeID:   id,
		Type:       "test.event",
		OccurredAt: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
		Metadata:   json.RawMessage(`{"device_id":"d1"}`),
		Payload:    json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)),
	}
}

func testEvents(prefix string, n int) []stream.Event {
	evs := make([]stream.Event, n)
	for i := range evs {
		evs[i] = testEvent(fmt.Sprintf("%s-%d", prefix, i+1))
	}
	return evs
}

// readAll reads streamID from the start with a consumer of its own.
func readAll(t *testing.T, ctx context.Context, b stream.Backend, streamID string) []stream.StoredEvent {
	t.Helper()
	id := "read-all-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: id, StreamID: streamID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	var all []stream.StoredEvent
	from := int64(0)
	for {
		batch, err := b.Read(ctx, id, from, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(batch.Events) == 0 {
			return all
		}
		all = append(all, batch.Events...)
		from = batch.Events[len(batch.Events)-1].Offset + 1
	}
}

// checkStoredOnce checks that the stream holds offsets 1..n densely, each
// identity once, and that every acknowledged event is at the offset its
// append reported.
func checkStoredOnce(t *testing.T, events []stream.StoredEvent, acked map[string]int64) {
	t.Helper()
	seen := map[string]int64{}
	for i, e := range events {
		if e.Offset != int64(i+1) {
			t.Fatalf("event %d read has offset %d, want %d (offsets not dense)", i, e.Offset, i+1)
		}
		if prev, ok := seen[e.NativeID]; ok {
			t.Errorf("%s stored twice, at %d and %d", e.NativeID, prev, e.Offset)
		}
		seen[e.NativeID] = e.Offset
	}
	for id, o := range acked {
		if got, ok := seen[id]; !ok || got != o {
			t.Errorf("%s acknowledged at offset %d, the stream holds it at %d (found %t)", id, o, got, ok)
		}
	}
}

// TestBrokerStoppedDuringAppends appends from several goroutines to a
// 3-broker cluster at replication factor 3 while one broker is taken out
// and brought back. A failed append is sent again, as a client would:
// at the end every acknowledged event is in the stream exactly once, at
// the offset reported, and the offsets are dense.
func TestBrokerStoppedDuringAppends(t *testing.T) {
	c := kafkatest.Start(t, 3)
	b := open(t, c, streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db"), ReplicationFactor: 3, ClaimTimeout: 2 * time.Second})
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	s, err := b.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	const writers, batches, size = 4, 40, 10
	var mu sync.Mutex
	acked := map[string]int64{}
	failures := 0
	var progress sync.WaitGroup
	progress.Add(writers)
	g, gctx := errgroup.WithContext(ctx)
	for w := range writers {
		g.Go(func() error {
			for i := range batches {
				if i == batches/4 {
					progress.Done()
				}
				evs := testEvents(fmt.Sprintf("w%d-b%d", w, i), size)
				for {
					res, err := b.Append(gctx, s.ID, evs)
					if err != nil {
						if gctx.Err() != nil {
							return err
						}
						mu.Lock()
						failures++
						mu.Unlock()
						time.Sleep(20 * time.Millisecond)
						continue
					}
					mu.Lock()
					for k, r := range res {
						if r.Err != nil {
							mu.Unlock()
							return fmt.Errorf("%s: %v", evs[k].NativeID, r.Err)
						}
						acked[evs[k].NativeID] = r.Offset
					}
					mu.Unlock()
					break
				}
			}
			return nil
		})
	}
	progress.Wait() // every writer is a quarter through
	leader := c.LeaderFor(streamkafka.TopicName(streamkafka.DefaultPrefix, s.ID), 0)
	c.RemoveBroker(leader)
	time.Sleep(time.Second) // appends go on with two brokers
	c.AddBroker(leader)
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("broker %d (the leader) out for a second: %d appends failed and were sent again", leader, failures)
	if len(acked) != writers*batches*size {
		t.Fatalf("%d events acknowledged, want %d", len(acked), writers*batches*size)
	}
	got := readAll(t, ctx, b, s.ID)
	if len(got) != len(acked) {
		t.Errorf("the stream holds %d events, want %d", len(got), len(acked))
	}
	checkStoredOnce(t, got, acked)
}

// TestRedeliveryAfterRestart: the events of a closed Backend, appended
// again through a new one on the same index and Kafka, are Duplicates at
// their original offsets, and the topic holds each once.
func TestRedeliveryAfterRestart(t *testing.T) {
	c := kafkatest.Start(t, 1)
	cfg := streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db")}
	ctx := t.Context()
	evs := testEvents("e", 20)

	first := open(t, c, cfg)
	s, err := first.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	orig, err := first.Append(ctx, s.ID, evs)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := open(t, c, cfg)
	defer second.Close()
	again, err := second.Append(ctx, s.ID, evs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range again {
		if !r.Duplicate || r.Err != nil || r.Offset != orig[i].Offset || !r.StoredAt.Equal(orig[i].StoredAt) {
			t.Errorf("%s again after a restart: %+v, want Duplicate at offset %d, stored %v", evs[i].NativeID, r, orig[i].Offset, orig[i].StoredAt)
		}
	}
	if n := c.Count(streamkafka.TopicName(streamkafka.DefaultPrefix, s.ID)); n != int64(len(evs)) {
		t.Errorf("the topic holds %d records, want %d", n, len(evs))
	}
}

var errCrash = errors.New("crashed (test hook)")

// TestClaimTakenOver simulates a process that dies between the steps of
// Append, leaving claims in the index, and checks what a new Backend
// does with them once they expired.
func TestClaimTakenOver(t *testing.T) {
	const claim = streamkafka.MinClaimTimeout
	for _, c := range []struct {
		name     string
		produced bool // the dead process produced the records
	}{
		{"produced_not_settled", true},
		{"claimed_not_produced", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			kc := kafkatest.Start(t, 1)
			cfg := streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db"), ClaimTimeout: claim}
			ctx := t.Context()
			evs := testEvents("e", 5)

			dead := open(t, kc, cfg)
			defer dead.Close()
			s, err := dead.EnsureStream(ctx, "devices")
			if err != nil {
				t.Fatal(err)
			}
			crash := func() error { return errCrash }
			if c.produced {
				streamkafka.SetHooks(dead, nil, crash)
			} else {
				streamkafka.SetHooks(dead, crash, nil)
			}
			if _, err := dead.Append(ctx, s.ID, evs[:3]); !errors.Is(err, errCrash) {
				t.Fatalf("Append with a crash: %v, want the crash", err)
			}
			topic := streamkafka.TopicName(streamkafka.DefaultPrefix, s.ID)
			wantBefore := int64(0)
			if c.produced {
				wantBefore = 3
			}
			if n := kc.Count(topic); n != wantBefore {
				t.Fatalf("the topic holds %d records after the crash, want %d", n, wantBefore)
			}

			b := open(t, kc, cfg)
			defer b.Close()
			// A live claim is not an event.
			if _, err := b.Lookup(ctx, s.ID, evs[0].NativeID, ""); !errors.Is(err, stream.ErrNotFound) {
				t.Errorf("Lookup of a claimed identity: %v, want ErrNotFound", err)
			}
			started := time.Now()
			res, err := b.Append(ctx, s.ID, evs) // the three claimed and two new
			if err != nil {
				t.Fatal(err)
			}
			if waited := time.Since(started); waited < claim/2 {
				t.Errorf("Append returned after %v: it did not wait for the claims to expire", waited)
			}
			// The two new events are produced while the claims are waited
			// for: they may come first.
			offsets := map[int64]string{}
			for i, r := range res {
				wantDup := c.produced && i < 3
				if r.Err != nil || r.Duplicate != wantDup || r.Offset < 1 || r.Offset > 5 || (wantDup && r.Offset != int64(i+1)) {
					t.Errorf("%s: %+v, want Duplicate %t at an offset in 1..5 (its own when a Duplicate)", evs[i].NativeID, r, wantDup)
				}
				offsets[r.Offset] = evs[i].NativeID
			}
			if len(offsets) != 5 {
				t.Errorf("offsets reported: %v, want 1..5 once each", offsets)
			}
			if n := kc.Count(topic); n != 5 {
				t.Errorf("the topic holds %d records, want 5", n)
			}
			checkStoredOnce(t, readAll(t, ctx, b, s.ID), nil)
			for i, ev := range evs {
				e, err := b.Lookup(ctx, s.ID, ev.NativeID, "")
				if err != nil || e.Offset != res[i].Offset {
					t.Errorf("Lookup(%s) = offset %d, %v; want %d", ev.NativeID, e.Offset, err, res[i].Offset)
				}
			}
			again, err := b.Append(ctx, s.ID, evs)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range again {
				if !r.Duplicate || r.Offset != res[i].Offset {
					t.Errorf("%s once more: %+v, want Duplicate at %d", evs[i].NativeID, r, res[i].Offset)
				}
			}
		})
	}
}

// TestLookupResolvesExpiredClaim: Lookup of an identity whose claim
// expired finds the record the dead process produced, or reports
// ErrNotFound when it produced none.
func TestLookupResolvesExpiredClaim(t *testing.T) {
	const claim = streamkafka.MinClaimTimeout
	kc := kafkatest.Start(t, 1)
	cfg := streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db"), ClaimTimeout: claim}
	ctx := t.Context()
	dead := open(t, kc, cfg)
	defer dead.Close()
	s, err := dead.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	streamkafka.SetHooks(dead, nil, func() error { return errCrash })
	if _, err := dead.Append(ctx, s.ID, []stream.Event{testEvent("produced")}); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	streamkafka.SetHooks(dead, func() error { return errCrash }, nil)
	if _, err := dead.Append(ctx, s.ID, []stream.Event{testEvent("lost")}); !errors.Is(err, errCrash) {
		t.Fatal(err)
	}
	time.Sleep(claim + 50*time.Millisecond) // the claims expire
	b := open(t, kc, cfg)
	defer b.Close()
	if e, err := b.Lookup(ctx, s.ID, "produced", ""); err != nil || e.Offset != 1 {
		t.Errorf("Lookup(produced) = offset %d, %v; want 1", e.Offset, err)
	}
	if _, err := b.Lookup(ctx, s.ID, "lost", ""); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Lookup(lost) = %v, want ErrNotFound", err)
	}
	// lost was never stored: appending it now stores it, at once.
	res, err := b.Append(ctx, s.ID, []stream.Event{testEvent("lost"), testEvent("produced")})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[0].Offset != 2 || !res[1].Duplicate || res[1].Offset != 1 {
		t.Errorf("append lost and produced: %+v, want lost new at 2 and produced Duplicate at 1", res)
	}
}

// TestTwoBackendsOneIndex appends overlapping identities from two
// Backends sharing one PostgreSQL index and one Kafka, as two postbox
// nodes would when agents send the same events to both: each identity is
// stored once, every report of it names the same offset, and offsets are
// dense.
func TestTwoBackendsOneIndex(t *testing.T) {
	url := testenv.URL(t, testenv.Postgres)
	kc := kafkatest.Start(t, 1)
	schema := "sk_two_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() { testenv.DropSchema(t, url, schema) })
	cfg := streamkafka.Config{Index: url, IndexSchema: schema}
	nodes := []*streamkafka.Backend{open(t, kc, cfg), open(t, kc, cfg)}
	for _, b := range nodes {
		defer b.Close()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Second)
	defer cancel()
	s, err := nodes[0].EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := nodes[1].EnsureStream(ctx, "devices"); err != nil || again.ID != s.ID || !again.CreatedAt.Equal(s.CreatedAt) {
		t.Fatalf("EnsureStream on the second node = %+v, %v; want %+v", again, err, s)
	}
	const ids, writers = 400, 8
	all := testEvents("e", ids)
	var mu sync.Mutex
	offsets := map[string]int64{}
	news := map[string]int{}
	g, gctx := errgroup.WithContext(ctx)
	for w := range writers {
		b := nodes[w%len(nodes)]
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			order := rng.Perm(ids)
			for len(order) > 0 {
				n := min(1+rng.IntN(16), len(order))
				batch := make([]stream.Event, n)
				for k := range batch {
					batch[k] = all[order[k]]
				}
				order = order[n:]
				res, err := b.Append(gctx, s.ID, batch)
				if err != nil {
					return err
				}
				mu.Lock()
				for k, r := range res {
					id := batch[k].NativeID
					if r.Err != nil || r.Offset < 1 {
						mu.Unlock()
						return fmt.Errorf("%s: %+v", id, r)
					}
					if prev, ok := offsets[id]; ok && prev != r.Offset {
						mu.Unlock()
						return fmt.Errorf("%s reported at offset %d and at %d", id, prev, r.Offset)
					}
					offsets[id] = r.Offset
					if !r.Duplicate {
						news[id]++
					}
				}
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, ev := range all {
		if news[ev.NativeID] != 1 {
			t.Errorf("%s reported new %d times, want once", ev.NativeID, news[ev.NativeID])
		}
	}
	got := readAll(t, ctx, nodes[1], s.ID)
	if len(got) != ids {
		t.Errorf("the stream holds %d events, want %d", len(got), ids)
	}
	checkStoredOnce(t, got, offsets)
	if n := kc.Count(streamkafka.TopicName(streamkafka.DefaultPrefix, s.ID)); n != ids {
		t.Errorf("the topic holds %d records, want %d", n, ids)
	}
}

// TestTrim: Trim deletes no event a consumer has not committed nor one
// stored at or after its time, and at most limit; a trimmed event is
// forgotten, so appending it again stores it anew.
func TestTrim(t *testing.T) {
	c := kafkatest.Start(t, 1)
	b := open(t, c, streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db")})
	defer b.Close()
	ctx := t.Context()
	s, err := b.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	evs := testEvents("e", 10)
	if _, err := b.Append(ctx, s.ID, evs[:6]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // a later millisecond
	between := time.Now()
	time.Sleep(5 * time.Millisecond)
	if _, err := b.Append(ctx, s.ID, evs[6:]); err != nil {
		t.Fatal(err)
	}
	trim := func(at time.Time, limit, want int) {
		t.Helper()
		n, err := b.Trim(ctx, s.ID, at, limit)
		if err != nil || n != want {
			t.Fatalf("Trim(%v, %d) = %d, %v; want %d", at, limit, n, err, want)
		}
	}
	trim(between, 2, 2)   // the limit
	trim(between, 100, 4) // up to the time: events 3..6
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "sub", StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Commit(ctx, "sub", 8); err != nil {
		t.Fatal(err)
	}
	trim(time.Now().Add(time.Hour), 100, 2) // up to what sub committed
	st, err := b.Stats(ctx, s.ID)
	if err != nil || st.Events != 2 || st.FirstOffset != 9 || st.LastOffset != 10 {
		t.Errorf("Stats after trims = %+v, %v; want events 9..10", st, err)
	}
	if _, err := b.Event(ctx, s.ID, 8); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Event(8) after its trim: %v, want ErrNotFound", err)
	}
	if _, err := b.Lookup(ctx, s.ID, evs[0].NativeID, ""); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Lookup of a trimmed event: %v, want ErrNotFound", err)
	}
	res, err := b.Append(ctx, s.ID, []stream.Event{evs[0], evs[9]})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[0].Offset != 11 || !res[1].Duplicate || res[1].Offset != 10 {
		t.Errorf("append a trimmed and a kept event: %+v, want the trimmed new at 11, the kept Duplicate at 10", res)
	}
}

// TestTrimWithinAppend: a Trim that deletes part of what one Append
// stored forgets those events only; the rest stay Duplicates.
func TestTrimWithinAppend(t *testing.T) {
	c := kafkatest.Start(t, 1)
	b := open(t, c, streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db")})
	defer b.Close()
	ctx := t.Context()
	s, err := b.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	evs := testEvents("e", 6)
	if _, err := b.Append(ctx, s.ID, evs); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Trim(ctx, s.ID, time.Now().Add(time.Hour), 2); err != nil || n != 2 {
		t.Fatalf("Trim = %d, %v; want 2", n, err)
	}
	for i, want := range []int64{0, 0, 3, 4} {
		e, err := b.Lookup(ctx, s.ID, evs[i].NativeID, "")
		if want == 0 && !errors.Is(err, stream.ErrNotFound) || want > 0 && (err != nil || e.Offset != want) {
			t.Errorf("Lookup(%s) = offset %d, %v; want %d (0: ErrNotFound)", evs[i].NativeID, e.Offset, err, want)
		}
	}
	res, err := b.Append(ctx, s.ID, evs[:3])
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[0].Offset != 7 || res[1].Duplicate || res[1].Offset != 8 || !res[2].Duplicate || res[2].Offset != 3 {
		t.Errorf("append two trimmed and a kept event: %+v, want the trimmed new at 7 and 8, the kept Duplicate at 3", res)
	}
	if n, err := b.Trim(ctx, s.ID, time.Now().Add(time.Hour), 100); err != nil || n != 6 {
		t.Fatalf("Trim of the rest = %d, %v; want 6", n, err)
	}
	res, err = b.Append(ctx, s.ID, evs[2:4])
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Duplicate || res[0].Offset != 9 || res[1].Duplicate || res[1].Offset != 10 {
		t.Errorf("append two events trimmed with the rest of their append: %+v, want new at 9 and 10", res)
	}
}

// TestWaitSeesOtherBackends: Wait returns when another Backend, as
// another process would, appends to the stream.
func TestWaitSeesOtherBackends(t *testing.T) {
	c := kafkatest.Start(t, 1)
	dir := t.TempDir()
	waiter := open(t, c, streamkafka.Config{Index: filepath.Join(dir, "a.db")})
	defer waiter.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := waiter.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiter.Wait(ctx, s.ID, 0) }()
	select {
	case err := <-done:
		t.Fatalf("Wait on an empty stream returned %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	other := open(t, c, streamkafka.Config{Index: filepath.Join(dir, "b.db")})
	defer other.Close()
	if _, err := other.EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Append(ctx, s.ID, testEvents("e", 1)); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(started); waited > time.Second {
		t.Errorf("Wait returned %v after another Backend's append, want within its 100 ms poll", waited)
	}
}

// TestTooLarge: an event that does not fit in a record batch of
// MaxRecordBytes is refused with ErrTooLarge, claims nothing, and the
// other events of its call are stored.
func TestTooLarge(t *testing.T) {
	c := kafkatest.Start(t, 1)
	b := open(t, c, streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db"), MaxRecordBytes: 4096})
	defer b.Close()
	ctx := t.Context()
	s, err := b.EnsureStream(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	big := testEvent("big")
	big.Payload = json.RawMessage(fmt.Sprintf(`{"blob":%q}`, make([]byte, 5000)))
	res, err := b.Append(ctx, s.ID, []stream.Event{testEvent("a"), big, testEvent("b"), big})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[0].Offset != 1 || res[2].Err != nil || res[2].Offset != 2 {
		t.Errorf("the events that fit: %+v, %+v; want offsets 1 and 2", res[0], res[2])
	}
	for _, k := range []int{1, 3} {
		if !errors.Is(res[k].Err, stream.ErrTooLarge) || res[k].Duplicate {
			t.Errorf("result %d: %+v, want ErrTooLarge", k, res[k])
		}
	}
	if _, err := b.Lookup(ctx, s.ID, "big", ""); !errors.Is(err, stream.ErrNotFound) {
		t.Errorf("Lookup(big): %v, want ErrNotFound", err)
	}
}

// TestTrimKeepsWhatIsNewerThanItsTime: a Trim of a stream without
// consumers, before any event's time, racing the stream's first appends,
// deletes nothing. (The end offset it falls back to when no event is
// stored at or after its time must be read before it looks, or it passes
// events appended meanwhile, which are newer than the time.)
func TestTrimKeepsWhatIsNewerThanItsTime(t *testing.T) {
	c := kafkatest.Start(t, 1)
	b := open(t, c, streamkafka.Config{Index: filepath.Join(t.TempDir(), "index.db")})
	defer b.Close()
	ctx := t.Context()
	past := time.Now().Add(-30 * 24 * time.Hour)
	for i := range 20 {
		s, err := b.EnsureStream(ctx, fmt.Sprintf("s%d", i))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for k := range 20 {
				if _, err := b.Append(ctx, s.ID, testEvents(fmt.Sprintf("e%d-", k), 5)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for {
			if _, err := b.Trim(ctx, s.ID, past, 1000); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			default:
				continue
			}
			break
		}
		st, err := b.Stats(ctx, s.ID)
		if err != nil || st.FirstOffset != 1 || st.Events != 100 {
			t.Fatalf("stream %s after Trims before every event's time: %+v, %v; want events 1..100", s.ID, st, err)
		}
	}
}
