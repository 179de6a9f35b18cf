package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// store is an Appender whose queue is full while it is held: AppendAsync
// waits, as streamsqlite's does, until it is let go.
type store struct {
	mu      sync.Mutex
	full    chan struct{} // closed when the queue has room again
	waiting int           // AppendAsync calls waiting for room
	stored  map[string]bool
}

func newStore() *store { return &store{full: make(chan struct{}), stored: map[string]bool{}} }

func (s *store) hold() {
	s.mu.Lock()
	s.full = make(chan struct{})
	s.mu.Unlock()
}

func (s *store) letGo() {
	s.mu.Lock()
	close(s.full)
	s.mu.Unlock()
}

func (s *store) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// QueueLen and QueueCap tell the ingress the queue is full while s is
// held, as streamsqlite's do.
func (s *store) QueueLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.full:
		return 0
	default:
		return 1
	}
}

func (s *store) QueueCap() int { return 1 }

func (s *store) AppendAsync(ctx context.Context, _ string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	s.mu.Lock()
	full := s.full
	s.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}()
	select {
	case <-full:
	case <-ctx.Done():
		return ctx.Err()
	}
	res := make([]stream.AppendResult, len(events))
	s.mu.Lock()
	for i, e := range events {
		res[i] = stream.AppendResult{StoredAt: time.Now(), Duplicate: s.stored[e.NativeID]}
		s.stored[e.NativeID] = true
	}
	s.mu.Unlock()
	done(res, nil)
	return nil
}

// serve runs an ingress over st until the test ends.
func serve(t *testing.T, st ingress.Appender, cfg ingress.Config) (*ingress.Ingress, string) {
	t.Helper()
	cfg.StreamID = "devices"
	in, err := ingress.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in)
	t.Cleanup(hs.Close)
	return in, "ws" + strings.TrimPrefix(hs.URL, "http")
}

func msgs(t *testing.T, prefix, device string, n int) []client.Message {
	t.Helper()
	out := make([]client.Message, n)
	for i := range out {
		m, err := client.Encode(postbox.Envelope{SchemaVersion: postbox.SchemaVersion, EventID: fmt.Sprintf("%s-%03d", prefix, i),
			Type: "sensor.reading", TS: "2026-02-16T23:10:21.123456Z", SessionID: "s", DeviceID: device, Payload: json.RawMessage(`{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = m
	}
	return out
}

// TestFullQueueKeepsHealthyConnections: while the store's queue stays full
// for many ping timeouts, a connection whose peer answers is not dropped
// by either side's pings, and everything it sent is ACKed once the queue
// has room.
func TestFullQueueKeepsHealthyConnections(t *testing.T) {
	// A timeout a loaded machine under -race keeps up with.
	const ping, timeout = 50 * time.Millisecond, 300 * time.Millisecond
	st := newStore()
	_, url := serve(t, st, ingress.Config{PingInterval: ping, PingTimeout: timeout})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{PingInterval: ping, PingTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	type sent struct {
		replies []postbox.Reply
		err     error
	}
	const frames = 4
	results := make(chan sent, frames)
	for f := range frames {
		m := msgs(t, fmt.Sprintf("full-%d", f), "pi-1", 50)
		go func() {
			rs, err := c.Send(ctx, m)
			results <- sent{rs, err}
		}()
	}
	testenv.Eventually(t, 10*time.Second, "the store's queue to be full", func() bool { return st.waiters() > 0 })
	// The stall itself is what is tested: it lasts many ping timeouts.
	stall := time.After(6 * (ping + timeout))
	for waiting := true; waiting; {
		select {
		case r := <-results:
			t.Fatalf("a Send ended while the queue was full: %v %v", r.err, r.replies)
		case <-stall:
			waiting = false
		}
	}
	if err := c.Err(); err != nil {
		t.Fatalf("the connection broke during the stall: %v", err)
	}
	st.letGo()
	for range frames {
		r := <-results
		if r.err != nil {
			t.Fatalf("Send after the stall: %v", r.err)
		}
		for _, rep := range r.replies {
			if !rep.OK() {
				t.Errorf("%s: %+v, want an ACK", rep.EventID, rep)
			}
		}
	}
}

// TestConnectionLimit: beyond MaxConnections a connection is refused
// before the upgrade with 503, Retry-After and a JSON error, and counted;
// a closed connection makes room again.
func TestConnectionLimit(t *testing.T) {
	st := newStore()
	st.letGo()
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	_, url := serve(t, st, ingress.Config{MaxConnections: 2, Metrics: m})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []*client.Conn
	for range 2 {
		c, err := client.Dial(ctx, url, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	req, _ := http.NewRequest(http.MethodGet, "http"+strings.TrimPrefix(url, "ws"), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("refusal body: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || body.Error.Code != "too_many_connections" || body.Error.Message == "" {
		t.Errorf("third connection: %d, Retry-After %q, %+v; want 503, a Retry-After and a too_many_connections error",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if _, err := client.Dial(ctx, url, client.Options{}); err == nil {
		t.Errorf("a WebSocket dial over the limit succeeded")
	}
	if got := metric(t, reg, "postbox_ingress_connections_refused_total"); got != 2 {
		t.Errorf("refused connections counted %v, want 2", got)
	}
	conns[0].Close()
	testenv.Eventually(t, 10*time.Second, "a closed connection to make room", func() bool {
		c, err := client.Dial(ctx, url, client.Options{})
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// metric returns the value of the unlabelled metric name in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestNewConnectionReplacesTheDevicesOld: with device tokens a device's new
// connection closes its old one at once, and what the old one still had
// queued is not written: only the new connection's envelopes are.
func TestNewConnectionReplacesTheDevicesOld(t *testing.T) {
	st := newStore()
	tokens := ingress.Tokens{}
	tokens.Add("tok-a", "pi-a")
	tokens.Add("tok-b", "pi-b")
	_, url := serve(t, st, ingress.Config{Tokens: tokens, PingInterval: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := client.Dial(ctx, url, client.Options{Token: "tok-a", PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	other, err := client.Dial(ctx, url, client.Options{Token: "tok-b", PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	oldSent := make(chan error, 1)
	go func() {
		_, err := old.Send(ctx, msgs(t, "old", "pi-a", 3))
		oldSent <- err
	}()
	otherSent := make(chan error, 1)
	go func() {
		_, err := other.Send(ctx, msgs(t, "other", "pi-b", 3))
		otherSent <- err
	}()
	testenv.Eventually(t, 10*time.Second, "both connections' envelopes to wait for the queue", func() bool { return st.waiters() == 2 })

	fresh, err := client.Dial(ctx, url, client.Options{Token: "tok-a", PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if err := <-oldSent; !errors.Is(err, client.ErrClosed) {
		t.Fatalf("the old connection's Send: %v, want it closed", err)
	}
	st.letGo()
	rs, err := fresh.Send(ctx, msgs(t, "fresh", "pi-a", 2))
	if err != nil || len(rs) != 2 || !rs[0].OK() || !rs[1].OK() {
		t.Fatalf("the new connection: %v %+v, want ACKs", err, rs)
	}
	if err := <-otherSent; err != nil {
		t.Errorf("another device's connection: %v, want it untouched", err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.stored["old-000"] {
		t.Errorf("the replaced connection's envelopes were written: %v", st.stored)
	}
}

// deafStore is an Appender that does not watch the caller's context: its
// queue takes events only once released, whether or not the caller is
// still there, as a writer that took them an instant before the caller
// went away does.
type deafStore struct {
	entered chan struct{} // AppendAsync was called
	release chan struct{}
}

func (s *deafStore) AppendAsync(_ context.Context, _ string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	s.entered <- struct{}{}
	<-s.release
	res := make([]stream.AppendResult, len(events))
	for i := range res {
		res[i].StoredAt = time.Now()
	}
	done(res, nil)
	return nil
}

// TestGRPCStreamGoneWhileItsEventsAreQueued: a gRPC stream's reader
// gives back what its connection holds as soon as the stream ends, while
// its enqueuer may still be handing a chunk to the store's queue; that
// chunk is the enqueuer's to account for, not given back twice (the
// enqueuer once found the pending list emptied under it and panicked).
func TestGRPCStreamGoneWhileItsEventsAreQueued(t *testing.T) {
	st := &deafStore{entered: make(chan struct{}, 1), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	in := newIngress(t, st, ingress.Config{Metrics: ingress.NewMetrics(reg)})
	_, dial := transports[1].serve(t, in)
	c := dialOK(t, dial, "")
	if err := c.Send(testCtx(t), frame(env("gone-1", "d", "t", `{}`))); err != nil {
		t.Fatal(err)
	}
	<-st.entered
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := in.Drain(ctx); err != nil { // returns once the reader ended
		t.Fatalf("the stream's reader did not end: %v", err)
	}
	close(st.release)
	testenv.Eventually(t, 10*time.Second, "the budget to be given back once", func() bool {
		return metric(t, reg, "postbox_ingress_buffered_bytes") == 0
	})
}
