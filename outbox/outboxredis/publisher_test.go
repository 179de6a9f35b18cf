package outboxredis_test

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxredis"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

func TestNewPublisherValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for name, cfg := range map[string]outboxredis.Config{
		"no stream":       {},
		"negative maxlen": {Stream: "s", MaxLen: -1},
		"unknown idmp":    {Stream: "s", IDMP: 7},
	} {
		if _, err := outboxredis.NewPublisher(c, cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := outboxredis.NewPublisher(nil, outboxredis.Config{Stream: "s"}); err == nil {
		t.Error("nil client: no error")
	}
}

func TestPublishWritesFieldsInOrder(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	p := newPublisher(t, c, outboxredis.Config{Stream: stream, Now: func() time.Time { return now }})
	msgs := messages("evt", 300)
	msgs[1].TenantID = "tenant-7"
	msgs[2].CorrelationID = ""

	replies, err := p.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range replies {
		if want := postbox.Ack(msgs[i].EventID, now, false); r != want {
			t.Fatalf("reply %d = %+v, want %+v", i, r, want)
		}
	}

	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(msgs) {
		t.Fatalf("stream holds %d entries, want %d", len(entries), len(msgs))
	}
	for i, e := range entries {
		m := msgs[i]
		want := map[string]any{
			outboxredis.FieldEventID:       m.EventID,
			outboxredis.FieldType:          m.Type,
			outboxredis.FieldPayload:       string(m.Body),
			outboxredis.FieldCorrelationID: m.CorrelationID,
			outboxredis.FieldCreatedAt:     m.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		if m.TenantID != "" {
			want[outboxredis.FieldTenantID] = m.TenantID
		}
		if len(e.Values) != len(want) {
			t.Fatalf("entry %d (%s) has fields %v, want %v", i, e.ID, e.Values, want)
		}
		for k, v := range want {
			if e.Values[k] != v {
				t.Fatalf("entry %d field %s = %q, want %q", i, k, e.Values[k], v)
			}
		}
	}
	if got := entries[0].Values[outboxredis.FieldCreatedAt]; got != "2030-01-02T02:04:05.123456789Z" {
		t.Errorf("created_at = %q, want UTC with nanoseconds", got)
	}
}

func TestPublishEmpty(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	p := newPublisher(t, c, outboxredis.Config{Stream: "s"})
	replies, err := p.Publish(context.Background(), nil)
	if err != nil || len(replies) != 0 {
		t.Fatalf("Publish(nil) = %v, %v", replies, err)
	}
}

func TestPublishMaxLenTrimsApproximately(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	const maxLen, total = 100, 3000
	p := newPublisher(t, c, outboxredis.Config{Stream: stream, MaxLen: maxLen})
	msgs := messages("trim", total)
	for batch := range slices.Chunk(msgs, 256) {
		publish(t, p, batch)
	}
	n, err := c.XLen(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	// "~" trims whole radix-tree nodes (stream-node-max-entries, 100 by
	// default): at least maxLen stay, and not many more.
	if n < maxLen || n > maxLen+200 {
		t.Fatalf("XLEN = %d after %d appends with MAXLEN ~ %d", n, total, maxLen)
	}
	last, err := c.XRevRangeN(context.Background(), stream, "+", "-", 1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := last[0].Values[outboxredis.FieldEventID]; got != msgs[total-1].EventID {
		t.Fatalf("newest entry is %v, want %s", got, msgs[total-1].EventID)
	}
}

func TestPublishRefusedCommandIsRetryableNack(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	if err := c.Set(context.Background(), stream, "not a stream", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c, outboxredis.Config{Stream: stream})
	msgs := messages("wrongtype", 5)
	replies, err := p.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatalf("Publish = %v; a refused command is a NACK, not a transport error", err)
	}
	if len(replies) != len(msgs) {
		t.Fatalf("%d replies to %d messages", len(replies), len(msgs))
	}
	for i, r := range replies {
		if r.OK() || r.EventID != msgs[i].EventID || r.Code != postbox.CodeUnavailable || !r.Retryable || !strings.Contains(r.Message, "WRONGTYPE") {
			t.Fatalf("reply %d = %+v, want a retryable unavailable NACK naming WRONGTYPE", i, r)
		}
	}
	// The Relay turns it into a retry, and parks it after MaxAttempts.
	if o := outbox.ReplyOutcome(replies[0], time.Now()); o.Kind != outbox.Retry {
		t.Fatalf("outcome %+v, want Retry", o)
	}
}

// closedAddr returns an address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestPublishTransportErrorFailsTheWholeBatch(t *testing.T) {
	for _, mode := range []outboxredis.IDMPMode{outboxredis.IDMPAuto, outboxredis.IDMPOff} {
		c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
		defer c.Close()
		p := newPublisher(t, c, outboxredis.Config{Stream: "s", IDMP: mode})
		replies, err := p.Publish(context.Background(), messages("down", 3))
		if err == nil || replies != nil {
			t.Fatalf("IDMP mode %d: Publish to a closed port = %v, %v; want an error and no replies", mode, replies, err)
		}
	}
}

func TestPublishCancelledContextIsATransportError(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	p := newPublisher(t, c, outboxredis.Config{Stream: stream, IDMP: outboxredis.IDMPOff})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	replies, err := p.Publish(ctx, messages("cancelled", 3))
	if err == nil || replies != nil {
		t.Fatalf("Publish with a cancelled context = %v, %v; want an error", replies, err)
	}
}

// The relay of an edge outbox (outboxsqlite) to Redis: every event is
// appended once the relay is done, and leaves the outbox.
func TestRelayFromSQLiteOutbox(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	store, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	storeDone := make(chan struct{})
	go func() { store.Run(ctx); close(storeDone) }()
	t.Cleanup(func() { cancel(); <-storeDone; store.Close() })

	const n = 700
	envs := make([]postbox.Envelope, n)
	for i := range envs {
		envs[i] = postbox.Envelope{
			SchemaVersion: postbox.SchemaVersion, EventID: outbox.NewEventID(), Type: "sensor.reading",
			TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "pi-01",
			Payload: json.RawMessage(`{"n":1}`),
		}
	}
	if _, err := store.Insert(ctx, envs); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(store, newPublisher(t, c, outboxredis.Config{Stream: stream}), outbox.RelayConfig{BatchSize: 128, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()

	testenv.Eventually(t, 20*time.Second, "the outbox to empty", func() bool {
		pending, rejected, err := store.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rejected != 0 {
			t.Fatalf("%d events rejected", rejected)
		}
		return pending == 0
	})
	cancel()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}

	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != n {
		t.Fatalf("stream holds %d entries, want %d", len(entries), n)
	}
	want := map[string]bool{}
	for _, e := range envs {
		want[e.EventID] = true
	}
	for _, e := range entries {
		id, _ := e.Values[outboxredis.FieldEventID].(string)
		if !want[id] {
			t.Fatalf("entry %s: event %q not inserted, or seen twice", e.ID, id)
		}
		delete(want, id)
		// An edge outbox hands out the payload, the envelope's fields beside it.
		if e.Values[outboxredis.FieldPayload] != `{"n":1}` || e.Values[outboxredis.FieldCorrelationID] != "sess-1" || e.Values[outboxredis.FieldTenantID] != "pi-01" {
			t.Fatalf("entry %s: %v; want the payload, the session as correlation id and the device as tenant", e.ID, e.Values)
		}
		if e.Values[outboxredis.FieldType] != "sensor.reading" {
			t.Fatalf("entry %s type %v", e.ID, e.Values[outboxredis.FieldType])
		}
	}
}

func BenchmarkPublish(b *testing.B) {
	c := newClient(b)
	stream := newStream(b, c)
	const batch = 256
	p := newPublisher(b, c, outboxredis.Config{Stream: stream, MaxLen: 100_000})
	payload := `{"order_id":"ord_01J8Z3","customer":"cus_42","amount_cents":129900,"currency":"EUR","items":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],"note":"benchmark payload of about two hundred bytes"}`
	msgs := messages("bench", batch)
	for i := range msgs {
		msgs[i].Body = []byte(payload)
		msgs[i].TenantID = "tenant-1"
	}
	ctx := context.Background()
	b.SetBytes(int64(batch * len(payload)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.Publish(ctx, msgs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}
