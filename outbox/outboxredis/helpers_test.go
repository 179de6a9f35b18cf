package outboxredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxredis"
)

// newClient connects to the Redis of POSTBOX_TEST_REDIS, or skips.
func newClient(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(testenv.URL(t, testenv.Redis))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis at %s: %v", opt.Addr, err)
	}
	return c
}

// newStream returns a stream name of its own for the test, deleted (with
// its dead-letter stream) when the test ends.
func newStream(t testing.TB, c *redis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	s := "postbox-test:" + name + ":" + hex.EncodeToString(b)
	t.Cleanup(func() { c.Del(context.Background(), s, s+outboxredis.DeadStreamSuffix) })
	return s
}

func messages(prefix string, n int) []outbox.Message {
	created := time.Date(2030, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))
	out := make([]outbox.Message, n)
	for i := range out {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		out[i] = outbox.Message{
			Seq: int64(i + 1), EventID: id, Type: "order.created",
			Body:          []byte(`{"id":"` + id + `"}`),
			CorrelationID: "corr-" + id, CreatedAt: created.Add(time.Duration(i) * time.Millisecond),
		}
	}
	return out
}

func newPublisher(t testing.TB, c redis.UniversalClient, cfg outboxredis.Config) *outboxredis.Publisher {
	t.Helper()
	p, err := outboxredis.NewPublisher(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// publish sends msgs and fails the test unless every one is ACKed.
func publish(t testing.TB, p *outboxredis.Publisher, msgs []outbox.Message) {
	t.Helper()
	replies, err := p.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range replies {
		if !r.OK() || r.EventID != msgs[i].EventID {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
}

// runConsumer runs c until the test ends (or stop is called), and
// returns stop, which cancels Run and waits for it.
func runConsumer(t testing.TB, c *outboxredis.Consumer) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return within 10s of its context's end")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// pendingCount returns the number of entries pending in group.
func pendingCount(t testing.TB, c *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := c.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// backdate makes the pending entries ids of group idle for an hour, as if
// consumer had been handed them an hour ago and died (XCLAIM IDLE JUSTID:
// no delivery is counted). A consumer then claims them on its first pass
// whatever its MinIdle, so a test need not give it a MinIdle shorter than
// its own round trips to Redis, nor wait.
func backdate(t testing.TB, c *redis.Client, stream, group, consumer string, ids ...string) {
	t.Helper()
	args := []any{"xclaim", stream, group, consumer, 0}
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, "idle", time.Hour.Milliseconds(), "justid")
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// recorder is a handler that remembers what it was handed.
type recorder struct {
	mu   sync.Mutex
	seen []outboxredis.Message
	fail func(m outboxredis.Message, calls int) error // nil: succeed
	byID map[string]int
}

func (r *recorder) handle(ctx context.Context, m outboxredis.Message) error {
	r.mu.Lock()
	if r.byID == nil {
		r.byID = map[string]int{}
	}
	r.seen = append(r.seen, m)
	r.byID[m.EventID]++
	calls, fail := r.byID[m.EventID], r.fail
	r.mu.Unlock()
	if fail != nil {
		return fail(m, calls)
	}
	return nil
}

func (r *recorder) calls(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID)
}

func (r *recorder) messages() []outboxredis.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outboxredis.Message(nil), r.seen...)
}

// logRecorder is a slog.Handler that keeps the records logged through it.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logRecorder) WithGroup(string) slog.Handler      { return h }

// find returns the messages of the records at level whose message
// contains substr.
func (h *logRecorder) find(level slog.Level, substr string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.records {
		if r.Level == level && strings.Contains(r.Message, substr) {
			out = append(out, r.Message)
		}
	}
	return out
}
