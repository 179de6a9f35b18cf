package ingress

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// lazyStore is an Appender whose queue takes every event at once and
// commits none until commit is called: a writer far slower than the
// readers, as SQLite is under a flood of large frames.
type lazyStore struct {
	mu      sync.Mutex
	auto    bool     // commit at once from now on
	waiting []func() // the answers of what was queued
	bytes   int64    // payload bytes queued and not committed
	peak    int64    // the most bytes ever queued and not committed
	events  int
}

func (s *lazyStore) AppendAsync(_ context.Context, _ string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	var n int64
	for _, e := range events {
		n += int64(len(e.Payload))
	}
	answer := func() {
		res := make([]stream.AppendResult, len(events))
		for i := range res {
			res[i].StoredAt = time.Now()
		}
		s.mu.Lock()
		s.bytes -= n
		s.mu.Unlock()
		done(res, nil)
	}
	s.mu.Lock()
	s.bytes += n
	s.peak = max(s.peak, s.bytes)
	s.events += len(events)
	auto := s.auto
	if !auto {
		s.waiting = append(s.waiting, answer)
	}
	s.mu.Unlock()
	if auto {
		answer()
	}
	return nil
}

// commitAll answers everything queued, and from now on commits at once.
func (s *lazyStore) commitAll() {
	s.mu.Lock()
	waiting := s.waiting
	s.waiting, s.auto = nil, true
	s.mu.Unlock()
	for _, f := range waiting {
		f()
	}
}

func (s *lazyStore) state() (events int, bytes, peak int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events, s.bytes, s.peak
}

// TestQueuedEventsCountUntilCommitted: events the writer's queue took
// still hold the ingress's memory until they are committed, so a writer
// slower than the connections cannot make the ingress read without bound
// (a review found 20 connections of 15 MB frames at 805 MB under a
// 128 MiB budget: the budget was given back as the queue took the events).
func TestQueuedEventsCountUntilCommitted(t *testing.T) {
	const (
		frameBytes  = 1 << 20
		bufferBytes = 2 << 20
		frames      = 16
		envelopes   = 4
		payloadSize = 100 << 10
	)
	st := &lazyStore{}
	in, url := start(t, st, Config{MaxFrameBytes: frameBytes, MaxBufferedBytes: bufferBytes, PingInterval: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(-1)
	pad := strings.Repeat("x", payloadSize)
	sent := make(chan error, 1)
	go func() {
		for f := range frames {
			var b strings.Builder
			b.WriteString("[")
			for e := range envelopes {
				if e > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, `{"schema_version":1,"event_id":"q-%d-%d","type":"t","ts":"2026-02-16T23:10:21Z","session_id":"s","device_id":"d","payload":{"p":"%s"}}`, f, e, pad)
			}
			b.WriteString("]")
			if err := c.Write(ctx, websocket.MessageText, []byte(b.String())); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	// The reader stops, waiting for room, once the queued events fill the
	// budget; without the bound it reads every frame into the queue.
	testenv.Eventually(t, 30*time.Second, "the reader to wait for room, or every frame to be queued", func() bool {
		events, _, _ := st.state()
		return in.budget.waiting.Load() == 1 || events == frames*envelopes
	})
	events, queued, peak := st.state()
	t.Logf("%d of %d events queued and not committed: %d KiB (peak %d KiB), ingress buffered %.0f KiB",
		events, frames*envelopes, queued>>10, peak>>10, gauge(in.m.buffered)/1024)
	if peak > bufferBytes {
		t.Errorf("the queue held %d KiB of events not committed, over the %d KiB the ingress may buffer", peak>>10, bufferBytes>>10)
	}
	if got := int64(gauge(in.m.buffered)); got < queued {
		t.Errorf("postbox_ingress_buffered_bytes is %d while %d bytes of events wait for their commit", got, queued)
	}

	// Committing gives the room back: every frame is read and answered.
	st.commitAll()
	for answered := 0; answered < frames*envelopes; {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading replies after %d: %v", answered, err)
		}
		answered += strings.Count(string(data), `"status":"stored"`)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the budget to be given back", func() bool {
		return gauge(in.m.buffered) == 0
	})
	if _, _, peak := st.state(); peak > bufferBytes {
		t.Errorf("the queue held %d KiB of events not committed, over the %d KiB the ingress may buffer", peak>>10, bufferBytes>>10)
	}
}

// TestBudgetReleasesMemoryWhenIdle: once the budget held a frame's worth
// and stays empty, the memory is given back to the system, once; activity
// while it waits puts the release off until the budget is empty and quiet
// again; small frames owe no release.
func TestBudgetReleasesMemoryWhenIdle(t *testing.T) {
	const frame = 1 << 20
	b := newBudget(4*frame, frame, prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}))
	var released atomic.Int32
	b.release = func() { released.Add(1) }
	b.releaseAfter = 20 * time.Millisecond
	ctx := context.Background()
	take := func(n int64) {
		t.Helper()
		if _, err := b.take(ctx, n, b, func() {}); err != nil {
			t.Fatal(err)
		}
		b.done(b)
	}
	pending := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.owed || b.timer != nil
	}

	take(frame / 4) // small: nothing owed
	b.give(frame / 4)
	if pending() {
		t.Fatalf("a quarter frame owes a release")
	}

	take(frame)
	b.give(frame / 2)
	take(frame / 8) // busy before the budget empties: the timer waits for it
	b.give(frame/2 + frame/8)
	testenv.Eventually(t, 5*time.Second, "the memory to be released", func() bool { return released.Load() == 1 })
	if pending() {
		t.Errorf("a release is still owed after it ran")
	}

	// Activity after the budget emptied puts the release off: it runs
	// once the budget is empty and quiet again.
	b.releaseAfter = time.Hour
	take(2 * frame)
	b.give(2 * frame)
	b.mu.Lock()
	timer := b.timer
	b.mu.Unlock()
	take(16) // between the timer's start and its end
	b.give(16)
	timer.Reset(0)
	testenv.Eventually(t, 5*time.Second, "the timer to wait again", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.timer != nil && b.timer != timer
	})
	if got := released.Load(); got != 1 {
		t.Fatalf("released %d times, want once: the budget was busy since the timer began", got)
	}
	b.mu.Lock()
	b.timer.Reset(0)
	b.mu.Unlock()
	testenv.Eventually(t, 5*time.Second, "the memory to be released again", func() bool { return released.Load() == 2 })
}

// gauge reads g's value.
func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	g.Write(&m)
	return m.GetGauge().GetValue()
}
