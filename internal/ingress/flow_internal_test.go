package ingress

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// heldStore is an Appender whose queue is full until open is closed.
type heldStore struct {
	open    chan struct{}
	mu      sync.Mutex
	waiting int
}

func (s *heldStore) AppendAsync(ctx context.Context, _ string, events []stream.Event, done func([]stream.AppendResult, error)) error {
	s.mu.Lock()
	s.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}()
	select {
	case <-s.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	res := make([]stream.AppendResult, len(events))
	for i := range res {
		res[i].StoredAt = time.Now()
	}
	done(res, nil)
	return nil
}

func (s *heldStore) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

func start(t *testing.T, st Appender, cfg Config) (*Ingress, string) {
	t.Helper()
	cfg.StreamID = "devices"
	in, err := New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(in)
	t.Cleanup(hs.Close)
	return in, "ws" + strings.TrimPrefix(hs.URL, "http")
}

// TestDrainAnswersAFrameReadBeforeItIsDecoded: a frame counts as in flight
// as soon as it is read, so a Drain that begins between reading and
// decoding it waits for its answers instead of closing the connection
// without them.
func TestDrainAnswersAFrameReadBeforeItIsDecoded(t *testing.T) {
	st := &heldStore{open: make(chan struct{})}
	close(st.open)
	in, url := start(t, st, Config{PingInterval: -1})
	read, decode := make(chan struct{}), make(chan struct{})
	in.afterRead = func() { close(read); <-decode }
	drainWaits := make(chan struct{}, 1)
	in.drainWaits = func() {
		select {
		case drainWaits <- struct{}{}:
		default:
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, url, client.Options{PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := client.Encode(postbox.Envelope{SchemaVersion: postbox.SchemaVersion, EventID: "evt-1", Type: "t", TS: "2026-02-16T23:10:21Z",
		SessionID: "s", DeviceID: "pi-1", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		replies []postbox.Reply
		err     error
	}
	sent := make(chan result, 1)
	go func() {
		rs, err := c.Send(ctx, []client.Message{m})
		sent <- result{rs, err}
	}()
	<-read
	drained := make(chan error, 1)
	go func() { drained <- in.Drain(ctx) }()
	select {
	case <-drainWaits: // the drain waits for the frame's answer
	case r := <-sent:
		t.Fatalf("the connection closed at Drain without answering a frame it read: %v %+v", r.err, r.replies)
	}
	close(decode)
	r := <-sent
	if r.err != nil || len(r.replies) != 1 || !r.replies[0].OK() {
		t.Fatalf("Send: %v %+v, want an ACK", r.err, r.replies)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// TestFloodIsBounded: many connections sending large frames while the
// store's queue is full hold no more memory than MaxBufferedBytes (plus a
// connection's own small buffers): the rest waits in the senders' sockets.
// Not parallel: it measures the heap.
func TestFloodIsBounded(t *testing.T) {
	const (
		conns       = 48
		envelopes   = 9
		payloadSize = 100 << 10
		frameBytes  = 1 << 20
		bufferBytes = 4 << 20
	)
	st := &heldStore{open: make(chan struct{})}
	in, url := start(t, st, Config{MaxFrameBytes: frameBytes, MaxBufferedBytes: bufferBytes, PingInterval: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := make([]*websocket.Conn, conns)
	for i := range cs {
		c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{Subprotocol}})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(64 << 20)
		defer c.CloseNow()
		cs[i] = c
	}
	heap0, rss0 := liveHeap(), rss()

	// Each connection streams one frame of about 900 KiB; the senders keep
	// one payload between them, so the heap is the server's.
	payload := []byte(`{"b":"` + strings.Repeat("x", payloadSize) + `"}`)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			w, err := c.Writer(ctx, websocket.MessageText)
			if err != nil {
				t.Error(err)
				return
			}
			w.Write([]byte("["))
			for e := range envelopes {
				if e > 0 {
					w.Write([]byte(","))
				}
				fmt.Fprintf(w, `{"schema_version":1,"event_id":"f-%d-%d","type":"t","ts":"2026-02-16T23:10:21Z","session_id":"s","device_id":"d-%d","payload":`, i, e, i)
				w.Write(payload)
				w.Write([]byte("}"))
			}
			w.Write([]byte("]"))
			if err := w.Close(); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		})
	}
	// Every frame is either decoded and waiting for the queue, or waiting
	// for room in the buffer before it is read.
	testenv.Eventually(t, 30*time.Second, "every connection to wait for the queue or the buffer", func() bool {
		return st.waiters()+int(in.budget.waiting.Load()) == conns
	})
	grew := int64(liveHeap()) - int64(heap0)
	t.Logf("%d connections × %d KiB frames: %d waiting for the queue, live heap +%.1f MiB, RSS +%.1f MiB",
		conns, envelopes*payloadSize>>10, st.waiters(), float64(grew)/(1<<20), float64(rss()-rss0)/(1<<20))
	if limit := int64(2*bufferBytes + conns*64<<10); grew > limit {
		t.Errorf("live heap grew by %.1f MiB with %d connections flooding, want at most %.1f MiB",
			float64(grew)/(1<<20), conns, float64(limit)/(1<<20))
	}

	close(st.open)
	for _, c := range cs {
		for answered := 0; answered < envelopes; {
			_, data, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("reading replies: %v", err)
			}
			answered += strings.Count(string(data), `"status":"stored"`)
		}
	}
	wg.Wait()
}

// liveHeap returns the bytes of live heap objects.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// rss returns the process's resident set in bytes (0 where /proc is not).
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	return 0
}

// TestRefusalsOfTheServerAreOutages: what the server NACKs for its own
// sake (shutting down, a failed commit) is an outage a sender waits out
// without counting an attempt against the events (outbox.IsOutage).
func TestRefusalsOfTheServerAreOutages(t *testing.T) {
	in := &Ingress{cfg: Config{StreamID: "devices"}, m: NewMetrics(nil)}
	replies := in.appendReplies(nil, "devices", nil, []string{"evt-1"}, nil, fmt.Errorf("database or disk is full"))
	replies = append(replies, postbox.Nack("evt-2", errShuttingDown))
	for _, r := range replies {
		if r.Code != postbox.CodeOutage || !r.Retryable {
			t.Errorf("%s: %+v, want a retryable outage NACK", r.EventID, r)
		}
	}
}
