package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/retry"
)

// clock is a fake time source shared by a store and a relay.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock {
	return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openStore opens an outbox under t.TempDir() and runs its writer.
func openStore(t testing.TB, now func() time.Time) *outboxsqlite.Store {
	t.Helper()
	s, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })
	return s
}

func envelope(id string) postbox.Envelope {
	return postbox.Envelope{
		SchemaVersion: postbox.SchemaVersion, EventID: id, Type: "test.event",
		TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "dev-1",
		Payload: json.RawMessage(`{"id":"` + id + `"}`),
	}
}

func insert(t testing.TB, s *outboxsqlite.Store, ids ...string) {
	t.Helper()
	envs := make([]postbox.Envelope, len(ids))
	for i, id := range ids {
		envs[i] = envelope(id)
	}
	res, err := s.Insert(context.Background(), envs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil || r.Duplicate {
			t.Fatalf("insert %s: %+v", r.EventID, r)
		}
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

func counts(t testing.TB, s *outboxsqlite.Store) (pending, rejected int64) {
	t.Helper()
	p, r, err := s.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

func row(t testing.TB, s *outboxsqlite.Store, id string) (outboxsqlite.Row, bool) {
	t.Helper()
	rows, err := s.List(context.Background(), "", 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.EventID == id {
			return r, true
		}
	}
	return outboxsqlite.Row{}, false
}

// pubFunc is an in-test outbox.Publisher.
type pubFunc func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error)

func (f pubFunc) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	return f(ctx, msgs)
}

func ack(m outbox.Message) postbox.Reply { return postbox.Ack(m.EventID, time.Now(), false) }

func nack(m outbox.Message, code postbox.Code, msg string) postbox.Reply {
	return postbox.Reply{EventID: m.EventID, Status: postbox.StatusNack, Code: code, Message: msg, Retryable: code.Retryable()}
}

// recorder remembers every message a publisher was handed.
type recorder struct {
	mu    sync.Mutex
	calls [][]outbox.Message
	sent  map[string][]outbox.Message // event id → each time it was sent
}

func (r *recorder) record(msgs []outbox.Message) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent == nil {
		r.sent = map[string][]outbox.Message{}
	}
	r.calls = append(r.calls, append([]outbox.Message(nil), msgs...))
	for _, m := range msgs {
		r.sent[m.EventID] = append(r.sent[m.EventID], m)
	}
	return len(r.calls)
}

func (r *recorder) sends(id string) []outbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Message(nil), r.sent[id]...)
}

func (r *recorder) numCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// runRelay runs a relay until the test ends and returns a function that
// stops it and returns Run's result.
func runRelay(t testing.TB, store outbox.Store, pub outbox.Publisher, cfg outbox.RelayConfig) (stop func() error) {
	t.Helper()
	r, err := outbox.NewRelay(store, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				runErr = errors.New("relay did not return within 10s of its context ending")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	})
	return stop
}

// probeStore wraps the real store: it counts Due calls and the rows they
// returned, and replaces the store's notifications with an unbuffered
// channel the test pokes. A poke is received only when the relay waits in
// its select, so two pokes in a row mean the relay ran one whole loop
// iteration after the first.
type probeStore struct {
	*outboxsqlite.Store
	poke     chan struct{}
	dues     atomic.Int64
	returned atomic.Int64
	sweeps   atomic.Int64 // Due calls from the start of the outbox (after == 0)
}

func (p *probeStore) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	msgs, err := p.Store.Due(ctx, now, after, limit)
	p.returned.Add(int64(len(msgs)))
	if after == 0 {
		p.sweeps.Add(1)
	}
	p.dues.Add(1)
	return msgs, err
}

func (p *probeStore) Notify() <-chan struct{} { return p.poke }

// step makes the relay run one full loop iteration.
func (p *probeStore) step(t testing.TB) {
	t.Helper()
	for range 2 {
		select {
		case p.poke <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatal("the relay did not come back to wait for notifications")
		}
	}
}

// countingStore counts full sweeps (Due from the start) and keeps the real
// store's notifications.
type countingStore struct {
	*outboxsqlite.Store
	sweeps atomic.Int64
}

func (c *countingStore) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	if after == 0 {
		defer c.sweeps.Add(1)
	}
	return c.Store.Due(ctx, now, after, limit)
}

var fast = outbox.RelayConfig{
	PollInterval: 10 * time.Millisecond,
	Retry:        retry.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond},
	Reconnect:    retry.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond},
}

func TestRelayDeletesRowsOnlyAfterAck(t *testing.T) {
	s := openStore(t, nil)
	all := ids("evt", 50)
	insert(t, s, all...)

	var rec recorder
	release := make(chan struct{})
	var inPublish atomic.Int64
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		rec.record(msgs)
		inPublish.Add(1)
		<-release
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
		}
		return out, nil
	})
	cfg := fast
	cfg.BatchSize = 10
	cfg.MinInFlight = 50 // all five batches in flight before any reply
	runRelay(t, s, pub, cfg)

	testenv.Eventually(t, 10*time.Second, "publishes in flight", func() bool { return inPublish.Load() == 5 })
	if p, r := counts(t, s); p != 50 || r != 0 {
		t.Fatalf("while every publish waits for its replies: pending=%d rejected=%d, want 50/0: a row left before its ACK", p, r)
	}
	close(release)
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { p, r := counts(t, s); return p == 0 && r == 0 })
	for _, id := range all {
		if n := len(rec.sends(id)); n != 1 {
			t.Errorf("%s sent %d times, want once", id, n)
		}
	}
}

func TestRelayKeepsRejectedRowAndDoesNotResendIt(t *testing.T) {
	s := openStore(t, nil)
	cs := &countingStore{Store: s}
	insert(t, s, "evt-a", "evt-bad", "evt-c")
	var rec recorder
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		rec.record(msgs)
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
			if m.EventID == "evt-bad" {
				out[i] = nack(m, postbox.CodeInvalidField, `ts: "yesterday" is not an RFC 3339 timestamp`)
			}
		}
		return out, nil
	})
	runRelay(t, cs, pub, fast)

	testenv.Eventually(t, 10*time.Second, "one rejected row and nothing pending", func() bool { p, r := counts(t, s); return p == 0 && r == 1 })
	rows, err := s.List(context.Background(), outboxsqlite.StateRejected, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("rejected rows: %+v", rows)
	}
	r := rows[0]
	if r.EventID != "evt-bad" || r.State != "rejected" || r.Attempts != 1 ||
		!strings.Contains(r.LastError, "invalid_field") || !strings.Contains(r.LastError, `ts: "yesterday" is not an RFC 3339 timestamp`) {
		t.Fatalf("rejected row = %+v, want evt-bad, state rejected, 1 attempt, last_error with the code and message", r)
	}
	// Let the relay sweep the outbox from the start several more times.
	base := cs.sweeps.Load()
	testenv.Eventually(t, 10*time.Second, "more sweeps", func() bool { return cs.sweeps.Load() >= base+5 })
	if n := len(rec.sends("evt-bad")); n != 1 {
		t.Fatalf("the rejected event was sent %d times, want once", n)
	}
}

func TestRelayRetryableNackResendsAfterBackoff(t *testing.T) {
	clk := newClock()
	s := openStore(t, clk.Now)
	ps := &probeStore{Store: s, poke: make(chan struct{})}
	insert(t, s, "evt-x")

	var rec recorder
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		n := rec.record(msgs)
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
			if n == 1 {
				out[i] = nack(m, postbox.CodeUnavailable, "the writer is busy")
			}
		}
		return out, nil
	})
	observed := make(chan outbox.Stats, 10)
	var logged testenv.Buffer
	cfg := outbox.RelayConfig{
		PollInterval: time.Hour, // only pokes wake the relay
		Retry:        retry.Backoff{Base: time.Hour, Max: 8 * time.Hour},
		Reconnect:    fast.Reconnect,
		Now:          clk.Now,
		Observe:      func(st outbox.Stats) { observed <- st },
		Logger:       slog.New(slog.NewTextHandler(&logged, nil)),
	}
	runRelay(t, ps, pub, cfg)
	if st := wait(t, observed); st.Retried != 1 {
		t.Fatalf("first publish: %+v, want 1 retried", st)
	}
	if log := logged.String(); !strings.Contains(log, "refused an event for now") || !strings.Contains(log, "event_id=evt-x") ||
		!strings.Contains(log, "the writer is busy") {
		t.Errorf("the log does not say why evt-x waits: %s", log)
	}
	r, ok := row(t, s, "evt-x")
	if !ok || r.State != "pending" || r.Attempts != 1 || r.LastError != "unavailable: the writer is busy" {
		t.Fatalf("after a retryable NACK: %+v, want pending, 1 attempt, the reason", r)
	}
	now := clk.Now()
	if !r.NextAttemptAt.After(now) || !r.NextAttemptAt.Before(now.Add(cfg.Retry.Ceiling(0))) {
		t.Fatalf("next_attempt_at = %s, want in (%s, %s)", r.NextAttemptAt, now, now.Add(cfg.Retry.Ceiling(0)))
	}
	// Before the backoff ends the relay looks, but the row is not due.
	for range 3 {
		before := ps.dues.Load()
		ps.step(t)
		if ps.dues.Load() == before {
			t.Fatal("the relay did not read due rows after a notification")
		}
	}
	if ps.returned.Load() != 1 || rec.numCalls() != 1 {
		t.Fatalf("before the backoff ended: %d rows handed out, %d publishes; want the first only", ps.returned.Load(), rec.numCalls())
	}
	clk.Add(r.NextAttemptAt.Sub(now))
	ps.step(t)
	if st := wait(t, observed); st.Delivered != 1 {
		t.Fatalf("second publish: %+v, want 1 delivered", st)
	}
	sends := rec.sends("evt-x")
	if len(sends) != 2 || sends[1].Attempts != 1 {
		t.Fatalf("evt-x sends: %+v, want 2 with the second carrying 1 attempt", sends)
	}
	if p, rj := counts(t, s); p != 0 || rj != 0 {
		t.Fatalf("pending=%d rejected=%d, want an empty outbox", p, rj)
	}
}

func wait[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the relay")
		panic("unreachable")
	}
}

// TestRelayTransportErrorPausesWithGrowingBackoff measures each pause the
// relay takes after a failed publish on a frozen clock: the clock moves
// only in steps of Base/4, and after each step two pokes show whether the
// relay read the outbox again.
func TestRelayTransportErrorPausesWithGrowingBackoff(t *testing.T) {
	clk := newClock()
	s := openStore(t, clk.Now)
	ps := &probeStore{Store: s, poke: make(chan struct{})}
	insert(t, s, "evt-x")

	const failures = 7
	var rec recorder
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		if rec.record(msgs) <= failures {
			return nil, errors.New("write tcp: connection reset by peer")
		}
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
		}
		return out, nil
	})
	observed := make(chan outbox.Stats, 10)
	reconnect := retry.Backoff{Base: time.Hour, Max: 64 * time.Hour}
	runRelay(t, ps, pub, outbox.RelayConfig{
		PollInterval: 1000 * time.Hour,
		Retry:        retry.Backoff{Base: time.Hour, Max: time.Hour},
		Reconnect:    reconnect,
		Now:          clk.Now,
		Observe:      func(st outbox.Stats) { observed <- st },
	})

	step := reconnect.Base / 4
	var pauses []time.Duration
	for k := range failures {
		st := wait(t, observed)
		if st.Unanswered != 1 || st.Err == nil {
			t.Fatalf("failed publish %d: %+v, want 1 unanswered and the error", k, st)
		}
		r, _ := row(t, s, "evt-x")
		if r.Attempts != 0 || !strings.Contains(r.LastError, "connection reset by peer") {
			t.Fatalf("after failure %d: %+v, want the transport error and no attempt counted", k, r)
		}
		var paused time.Duration
		for {
			before := ps.dues.Load()
			ps.step(t)
			if ps.dues.Load() > before {
				break // the pause is over: the relay read the row and publishes it
			}
			if paused >= reconnect.Ceiling(k) {
				t.Fatalf("after failure %d the relay was still paused %s later; the pause must be under Ceiling(%d) = %s", k, paused, k, reconnect.Ceiling(k))
			}
			clk.Add(step)
			paused += step
		}
		if paused == 0 {
			t.Fatalf("after failure %d the relay published again without pausing", k)
		}
		pauses = append(pauses, paused)
	}
	if st := wait(t, observed); st.Delivered != 1 {
		t.Fatalf("last publish: %+v, want 1 delivered", st)
	}
	sends := rec.sends("evt-x")
	if len(sends) != failures+1 || sends[failures].Attempts != 0 {
		t.Fatalf("evt-x was sent %d times, last with %d attempts; want %d, and no attempt counted for the outage", len(sends), sends[len(sends)-1].Attempts, failures+1)
	}
	t.Logf("pauses after each failure (full jitter under Base·2^n): %v", pauses)
	grew := false
	for _, p := range pauses[2:] {
		grew = grew || p > reconnect.Base
	}
	if !grew {
		t.Fatalf("no pause after the third failure exceeded Base %s: %v; the pause does not grow", reconnect.Base, pauses)
	}
}

// TestRelayBoundsInFlightAndBatches drives the relay with a slow publisher
// that also NACKs and fails now and then, which makes the relay sweep the
// outbox again while batches are in flight.
func TestRelayBoundsInFlightAndBatches(t *testing.T) {
	const batchSize, maxInFlight, n = 7, 20, 300
	s := openStore(t, nil)
	all := ids("evt", n)
	insert(t, s, all...)

	var (
		mu          sync.Mutex
		inFlight    int
		maxSeen     int
		biggest     int
		active      = map[string]bool{}
		acked       = map[string]int{}
		ackedTotal  int
		attempts    = map[string]int{}
		violations  []string
		gate        = make(chan struct{})
		calls       int
		concurrency int
		maxCalls    int
	)
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		mu.Lock()
		calls++
		call := calls
		concurrency++
		maxCalls = max(maxCalls, concurrency)
		biggest = max(biggest, len(msgs))
		for _, m := range msgs {
			if active[m.EventID] {
				violations = append(violations, m.EventID+" published while already in flight")
			}
			active[m.EventID] = true
		}
		inFlight += len(msgs)
		maxSeen = max(maxSeen, inFlight)
		g := gate
		if inFlight >= min(maxInFlight, n-ackedTotal) {
			// The window is full, or holds every row not yet ACKed: let
			// every waiting publish answer.
			close(gate)
			gate = make(chan struct{})
		}
		mu.Unlock()

		select {
		case <-g:
		case <-time.After(2 * time.Second): // only if the relay stalls; the checks below then fail
		case <-ctx.Done():
		}

		mu.Lock()
		defer mu.Unlock()
		concurrency--
		inFlight -= len(msgs)
		for _, m := range msgs {
			delete(active, m.EventID)
		}
		if call%9 == 0 {
			return nil, errors.New("connection reset")
		}
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			attempts[m.EventID]++
			if attempts[m.EventID] == 1 && (len(m.EventID)+int(m.Seq))%5 == 0 {
				out[i] = nack(m, postbox.CodeUnavailable, "busy")
				continue
			}
			out[i] = ack(m)
			acked[m.EventID]++
			ackedTotal++
		}
		return out, nil
	})
	cfg := outbox.RelayConfig{
		BatchSize: batchSize, MaxInFlight: maxInFlight, PollInterval: 5 * time.Millisecond,
		Retry:     retry.Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond},
		Reconnect: retry.Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond},
	}
	runRelay(t, s, pub, cfg)
	testenv.Eventually(t, 20*time.Second, "the outbox to empty", func() bool { p, r := counts(t, s); return p == 0 && r == 0 })

	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("%d events were in flight twice at once, e.g. %s", len(violations), violations[0])
	}
	if maxSeen > maxInFlight {
		t.Fatalf("%d messages in flight at once, over MaxInFlight %d", maxSeen, maxInFlight)
	}
	if maxSeen < maxInFlight {
		t.Fatalf("at most %d messages were ever in flight; the test never filled the window of %d", maxSeen, maxInFlight)
	}
	if biggest > batchSize {
		t.Fatalf("a batch of %d messages, over BatchSize %d", biggest, batchSize)
	}
	if maxCalls < 3 {
		t.Fatalf("at most %d publishes ran at once; want several batches in flight", maxCalls)
	}
	for _, id := range all {
		if acked[id] != 1 {
			t.Errorf("%s ACKed %d times, want once", id, acked[id])
		}
	}
	t.Logf("%d publishes, up to %d at once, %d messages in flight at most", calls, maxCalls, maxSeen)
}

func TestRelayRequeuedRowIsSentAgain(t *testing.T) {
	s := openStore(t, nil)
	insert(t, s, "evt-x")
	var rec recorder
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		n := rec.record(msgs)
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
			if n == 1 {
				out[i] = nack(m, postbox.CodeTooLarge, "envelope is 9000 bytes, over the limit of 4096")
			}
		}
		return out, nil
	})
	runRelay(t, s, pub, fast)
	testenv.Eventually(t, 10*time.Second, "the row to be rejected", func() bool { _, r := counts(t, s); return r == 1 })
	n, err := s.Requeue(context.Background(), []string{"evt-x"})
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	testenv.Eventually(t, 10*time.Second, "the outbox to empty", func() bool { p, r := counts(t, s); return p == 0 && r == 0 })
	sends := rec.sends("evt-x")
	if len(sends) != 2 || sends[1].Attempts != 0 {
		t.Fatalf("evt-x sends: %d, the second with %d attempts; want 2, the second counted from zero again", len(sends), sends[len(sends)-1].Attempts)
	}
}

// TestRelayResendsRowsBehindTheCursorUnderSteadyTraffic: rows that become
// due behind the relay's cursor (a retry whose backoff ended, a requeued
// row) must be sent within about PollInterval even while new rows keep
// arriving more often than that.
func TestRelayResendsRowsBehindTheCursorUnderSteadyTraffic(t *testing.T) {
	clk := newClock()
	s := openStore(t, clk.Now)
	insert(t, s, "evt-retry", "evt-reject")
	var rec recorder
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		rec.record(msgs)
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = ack(m)
			if m.Attempts == 0 && m.EventID == "evt-retry" {
				out[i] = nack(m, postbox.CodeUnavailable, "busy")
			}
			if m.Attempts == 0 && m.EventID == "evt-reject" {
				out[i] = nack(m, postbox.CodeInvalidField, "bad")
			}
		}
		return out, nil
	})
	const poll = 50 * time.Millisecond
	runRelay(t, s, pub, outbox.RelayConfig{
		PollInterval: poll,
		Retry:        retry.Backoff{Base: time.Hour, Max: time.Hour},
		Reconnect:    fast.Reconnect,
		Now:          clk.Now,
	})
	testenv.Eventually(t, 10*time.Second, "the first answers", func() bool {
		r, ok := row(t, s, "evt-retry")
		_, rejected := counts(t, s)
		return ok && r.Attempts == 1 && rejected == 1
	})

	// New rows arrive every few milliseconds, far more often than poll.
	ctx, cancel := context.WithCancel(context.Background())
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		tick := time.NewTicker(poll / 10)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := s.Insert(ctx, []postbox.Envelope{envelope(fmt.Sprintf("evt-traffic-%d", i))}); err != nil && ctx.Err() == nil {
				t.Errorf("insert: %v", err)
				return
			}
		}
	}()
	defer func() { cancel(); <-produced }()
	testenv.Eventually(t, 10*time.Second, "traffic to flow", func() bool { return len(rec.sends("evt-traffic-1")) == 1 })

	clk.Add(2 * time.Hour) // evt-retry's backoff is over
	if _, err := s.Requeue(context.Background(), []string{"evt-reject"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 100*poll, "the retried and the requeued row to be sent again under steady traffic", func() bool {
		return len(rec.sends("evt-retry")) == 2 && len(rec.sends("evt-reject")) == 2
	})
}

func TestRelayStopsWhenContextEnds(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		s := openStore(t, nil)
		pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
			t.Error("nothing to publish")
			return nil, errors.New("unexpected")
		})
		stop := runRelay(t, s, pub, outbox.RelayConfig{PollInterval: time.Hour})
		if err := stop(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	})
	t.Run("publish in flight", func(t *testing.T) {
		s := openStore(t, nil)
		insert(t, s, "evt-x")
		started := make(chan struct{})
		pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		})
		stop := runRelay(t, s, pub, fast)
		wait(t, started)
		if err := stop(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		r, ok := row(t, s, "evt-x")
		if !ok || r.State != "pending" || r.Attempts != 0 || r.LastError == "" {
			t.Fatalf("after a cancelled publish: %+v (present %v), want the row pending, its error recorded, no attempt counted", r, ok)
		}
	})
	t.Run("store that does not answer", func(t *testing.T) {
		// A store whose Settle hangs (a database gone silent) holds up a
		// shutdown for SettleTimeout at most; the row stays due.
		s := &hangingSettle{Store: openStore(t, nil)}
		insert(t, s.Store, "evt-x")
		published := make(chan struct{}, 1)
		pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
			select {
			case published <- struct{}{}:
			default:
			}
			out := make([]postbox.Reply, len(msgs))
			for i, m := range msgs {
				out[i] = ack(m)
			}
			return out, nil
		})
		cfg := fast
		cfg.SettleTimeout = 200 * time.Millisecond
		stop := runRelay(t, s, pub, cfg)
		wait(t, published)
		if err := stop(); err != nil {
			t.Fatalf("Run = %v, want nil after the settle timed out", err)
		}
		if r, ok := row(t, s.Store, "evt-x"); !ok || r.State != "pending" {
			t.Fatalf("after a settle that timed out: %+v (present %v), want the row still pending", r, ok)
		}
	})
	t.Run("publisher slow to give up", func(t *testing.T) {
		// A publisher that takes a while to notice the end: Run waits for
		// it without spinning.
		s := openStore(t, nil)
		insert(t, s, "evt-x")
		started := make(chan struct{})
		pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
			close(started)
			<-ctx.Done()
			<-time.After(100 * time.Millisecond) // the transport's own shutdown
			return nil, ctx.Err()
		})
		var nows atomic.Int64
		cfg := fast
		cfg.PollInterval = time.Hour // no timer turns the loop
		cfg.Now = func() time.Time { nows.Add(1); return time.Now() }
		stop := runRelay(t, s, pub, cfg)
		wait(t, started)
		before := nows.Load()
		if err := stop(); err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if n := nows.Load() - before; n > 50 {
			t.Fatalf("the relay looped %d times while waiting 100ms for a publish to return after its context ended; it spins", n)
		}
	})
}

// hangingSettle is a store whose Settle waits until its context ends.
type hangingSettle struct{ *outboxsqlite.Store }

func (h *hangingSettle) Settle(ctx context.Context, _ []outbox.Outcome) error {
	<-ctx.Done()
	return ctx.Err()
}
