package streampg_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streampg"
	"github.com/postbox-events/postbox/stream/streamtest"
)

// schemas hands out one schema per store name, unique to this process and
// run, and drops it when the test ends.
type schemas struct {
	url string
	run string
}

func newSchemas(t *testing.T) *schemas {
	return &schemas{url: testenv.URL(t, testenv.Postgres), run: strconv.FormatInt(time.Now().UnixNano(), 36)}
}

// schema returns the schema of name: PostgreSQL names are at most 63
// bytes, test names are longer, so it is a hash.
func (s *schemas) schema(t *testing.T, name string) string {
	sum := sha256.Sum256([]byte(name))
	schema := "sp_" + s.run + "_" + hex.EncodeToString(sum[:10])
	t.Cleanup(func() { testenv.DropSchema(t, s.url, schema) }) // after the backend's Close, which the suite registers later
	return schema
}

func (s *schemas) open(t *testing.T, schema string) *streampg.Backend {
	t.Helper()
	b, err := streampg.Open(t.Context(), streampg.Config{URL: s.url, Schema: schema})
	if err != nil {
		t.Fatalf("Open(schema %s): %v", schema, err)
	}
	return b
}

func TestConformance(t *testing.T) {
	s := newSchemas(t)
	streamtest.Run(t, streamtest.Features{}, func(t *testing.T, name string) stream.Backend {
		return s.open(t, s.schema(t, name))
	})
}

// TestTwoProcesses appends to one stream from two Backends, each with its
// own pool, as two postbox processes sharing a database would: offsets are
// dense, each event is stored once, and every acknowledged event is
// readable at its offset.
func TestTwoProcesses(t *testing.T) {
	s := newSchemas(t)
	schema := s.schema(t, t.Name())
	procs := []*streampg.Backend{s.open(t, schema), s.open(t, schema)}
	for _, b := range procs {
		t.Cleanup(func() { b.Close() })
	}
	ctx := t.Context()
	if _, err := procs[0].EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	const writers, batches, size = 8, 25, 8
	var mu sync.Mutex
	acked := map[int64]string{} // offset → native id
	g, gctx := errgroup.WithContext(ctx)
	for w := range writers {
		b := procs[w%len(procs)]
		g.Go(func() error {
			for i := range batches {
				var evs []stream.Event
				for j := range size {
					// Every event is sent by two writers (one per process), so
					// both processes race on each identity.
					id := fmt.Sprintf("e-%d-%d-%d", w/2, i, j)
					evs = append(evs, stream.Event{NativeID: id, Type: "t", OccurredAt: time.Now(),
						Payload: []byte(`{"id":"` + id + `"}`)})
				}
				res, err := b.Append(gctx, "devices", evs)
				if err != nil {
					return err
				}
				mu.Lock()
				for k, r := range res {
					if r.Err != nil || r.Offset < 1 {
						mu.Unlock()
						return fmt.Errorf("%s: %+v", evs[k].NativeID, r)
					}
					if prev, ok := acked[r.Offset]; ok && prev != evs[k].NativeID {
						mu.Unlock()
						return fmt.Errorf("offset %d given to %s and %s", r.Offset, prev, evs[k].NativeID)
					}
					acked[r.Offset] = evs[k].NativeID
				}
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	const total = writers / 2 * batches * size
	offsets := slices.Sorted(maps.Keys(acked))
	if len(offsets) != total || offsets[0] != 1 || offsets[len(offsets)-1] != total {
		t.Fatalf("acknowledged %d offsets from %d to %d, want 1..%d", len(offsets), offsets[0], offsets[len(offsets)-1], total)
	}
	st, err := procs[1].Stats(ctx, "devices")
	if err != nil {
		t.Fatal(err)
	}
	if st.Events != total || st.FirstOffset != 1 || st.LastOffset != total {
		t.Errorf("Stats = %+v, want %d events at 1..%d", st, total, total)
	}
	seen := map[string]bool{}
	for from := int64(1); from <= total; {
		evs, err := procs[1].ReadStream(ctx, "devices", from, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			t.Fatalf("nothing to read from offset %d", from)
		}
		for _, e := range evs {
			if e.Offset != from || acked[e.Offset] != e.NativeID || seen[e.NativeID] {
				t.Fatalf("read %s at offset %d, want %s at %d, each once", e.NativeID, e.Offset, acked[from], from)
			}
			seen[e.NativeID] = true
			from++
		}
	}
}

// TestTrim deletes what every consumer read and is older than t, never
// more than the limit, and never reuses an offset afterwards.
func TestTrim(t *testing.T) {
	s := newSchemas(t)
	b := s.open(t, s.schema(t, t.Name()))
	t.Cleanup(func() { b.Close() })
	ctx := t.Context()
	if _, err := b.EnsureStream(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	var evs []stream.Event
	for i := range 10 {
		evs = append(evs, stream.Event{NativeID: strconv.Itoa(i), Type: "t", Payload: []byte(`{}`)})
	}
	if _, err := b.Append(ctx, "src", evs); err != nil {
		t.Fatal(err)
	}
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "c", StreamID: "src", Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Commit(ctx, "c", 6); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	trim := func(limit, want int) {
		t.Helper()
		n, err := b.Trim(ctx, "src", future, limit)
		if err != nil || n != want {
			t.Fatalf("Trim(limit %d) = %d, %v; want %d", limit, n, err, want)
		}
	}
	trim(4, 4)  // 1..4
	trim(10, 2) // 5, 6: the consumer has not read 7
	trim(10, 0)
	if _, err := b.Commit(ctx, "c", 10); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Trim(ctx, "src", time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
		t.Fatalf("Trim before every event = %d, %v; want 0", n, err)
	}
	trim(10, 4) // everything
	if err := b.DeleteConsumer(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	res, err := b.Append(ctx, "src", []stream.Event{{NativeID: "new", Type: "t", Payload: []byte(`{}`)}})
	if err != nil || res[0].Offset != 11 {
		t.Fatalf("append after trimming everything = %+v, %v; want offset 11", res, err)
	}
	st, err := b.Stats(ctx, "src")
	if err != nil || st.Events != 1 || st.FirstOffset != 11 || st.LastOffset != 11 {
		t.Fatalf("Stats = %+v, %v; want 1 event at 11", st, err)
	}
	if _, err := b.Event(ctx, "src", 3); err == nil {
		t.Errorf("Event(3) after trim: found, want ErrNotFound")
	}
}
