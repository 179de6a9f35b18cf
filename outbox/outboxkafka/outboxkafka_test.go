package outboxkafka_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
)

func newPublisher(t *testing.T, c *kafkatest.Cluster, cfg outboxkafka.Config) *outboxkafka.Publisher {
	t.Helper()
	cfg.Brokers = c.Brokers()
	p, err := outboxkafka.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func msg(i int, correlation string, body string) outbox.Message {
	return outbox.Message{Seq: int64(i), EventID: fmt.Sprintf("ev-%02d", i), Type: "order.created", Body: []byte(body),
		CorrelationID: correlation, TenantID: "acme", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

func publish(t *testing.T, p *outboxkafka.Publisher, msgs []outbox.Message) []postbox.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	replies, err := p.Publish(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != len(msgs) {
		t.Fatalf("%d replies to %d messages", len(replies), len(msgs))
	}
	return replies
}

// TestPublishReadBack publishes events of three keys to a topic of three
// partitions and reads them back: one record each, keyed by correlation
// id, the event id and fields as headers, the body as value, each key's
// records in order, written by an idempotent producer.
func TestPublishReadBack(t *testing.T) {
	c := kafkatest.Start(t, 1)
	c.CreateTopic("orders", 3, nil)
	p := newPublisher(t, c, outboxkafka.Config{Topic: "orders"})
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, msg(i, fmt.Sprintf("order-%d", i%3), fmt.Sprintf(`{"n":%d}`, i)))
	}
	msgs[29].CorrelationID = "" // keyed by its event id
	for i, r := range publish(t, p, msgs) {
		if !r.OK() || r.EventID != msgs[i].EventID {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
	recs := c.Read("orders", 30)
	if len(recs) != 30 {
		t.Fatalf("read %d records, want 30", len(recs))
	}
	byID := map[string]outbox.Message{}
	for _, m := range msgs {
		byID[m.EventID] = m
	}
	last := map[string]int64{}
	for _, r := range recs {
		id := header(r, outboxkafka.HeaderEventID)
		m, ok := byID[id]
		if !ok {
			t.Fatalf("record with event id %q", id)
		}
		delete(byID, id)
		wantKey := m.CorrelationID
		if wantKey == "" {
			wantKey = m.EventID
		}
		if string(r.Key) != wantKey || string(r.Value) != string(m.Body) {
			t.Errorf("%s: key %q value %s, want %q %s", id, r.Key, r.Value, wantKey, m.Body)
		}
		if header(r, outboxkafka.HeaderEventType) != "order.created" || header(r, outboxkafka.HeaderTenantID) != "acme" ||
			header(r, outboxkafka.HeaderCorrelationID) != m.CorrelationID ||
			header(r, outboxkafka.HeaderCreatedAt) != "2026-01-02T03:04:05.000000006Z" {
			t.Errorf("%s: headers %v", id, r.Headers)
		}
		if prev, ok := last[string(r.Key)]; ok && m.Seq < prev {
			t.Errorf("key %s: %s (seq %d) after seq %d", r.Key, id, m.Seq, prev)
		}
		last[string(r.Key)] = m.Seq
		if r.ProducerID < 0 {
			t.Errorf("%s: producer id %d: not written by an idempotent producer", id, r.ProducerID)
		}
	}
	if len(byID) != 0 {
		t.Errorf("not read back: %v", byID)
	}
}

// TestKeyFunc: Config.Key chooses the record key.
func TestKeyFunc(t *testing.T) {
	c := kafkatest.Start(t, 1, "orders")
	p := newPublisher(t, c, outboxkafka.Config{Topic: "orders", Key: outboxkafka.KeyEventID})
	publish(t, p, []outbox.Message{msg(1, "corr", "{}")})
	if r := c.Read("orders", 1)[0]; string(r.Key) != "ev-01" {
		t.Errorf("key %q, want the event id", r.Key)
	}
}

// TestOutage: with the brokers down a Publish fails as a whole (the relay
// waits and sends again); once they are back the same messages are
// delivered.
func TestOutage(t *testing.T) {
	c := kafkatest.Start(t, 1, "orders")
	p := newPublisher(t, c, outboxkafka.Config{Topic: "orders"})
	first := []outbox.Message{msg(1, "k", `{"a":1}`)}
	publish(t, p, first)

	c.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	down := []outbox.Message{msg(2, "k", `{"a":2}`), msg(3, "k", `{"a":3}`)}
	if replies, err := p.Publish(ctx, down); err == nil {
		t.Fatalf("published to a stopped cluster: %+v", replies)
	}

	c.Restart()
	for i, r := range publish(t, p, down) {
		if !r.OK() {
			t.Errorf("after the restart, reply %d: %+v", i, r)
		}
	}
	seen := map[string]bool{}
	for _, r := range c.Read("orders", 3) {
		seen[header(r, outboxkafka.HeaderEventID)] = true
	}
	for _, id := range []string{"ev-01", "ev-02", "ev-03"} {
		if !seen[id] {
			t.Errorf("%s not in the topic: %v", id, seen)
		}
	}
}

// TestTooLarge: a record over MaxRecordBytes is refused alone, for good
// (parked), and the records around it, of the same key, are delivered.
func TestTooLarge(t *testing.T) {
	c := kafkatest.Start(t, 1)
	c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"})
	p := newPublisher(t, c, outboxkafka.Config{Topic: "small", MaxRecordBytes: 2000})
	big := bigBody()
	msgs := []outbox.Message{msg(1, "k", "{}"), msg(2, "k", big), msg(3, "k", "{}")}
	replies := publish(t, p, msgs)
	if !replies[0].OK() || !replies[2].OK() {
		t.Errorf("the small records: %+v, %+v", replies[0], replies[2])
	}
	if r := replies[1]; r.OK() || r.Retryable || r.Code != postbox.CodeTooLarge {
		t.Errorf("the large record: %+v, want a non-retryable too_large NACK", r)
	}
	if n := c.Count("small"); n != 2 {
		t.Errorf("topic holds %d records, want 2", n)
	}
}

// TestBrokerTooLarge: with MaxRecordBytes above the topic's limit the
// broker refuses the whole batch; its records are NACKed retryable, and a
// later record of a key whose record failed is held back, never ACKed
// ahead of it.
func TestBrokerTooLarge(t *testing.T) {
	c := kafkatest.Start(t, 1)
	c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2000"})
	p := newPublisher(t, c, outboxkafka.Config{Topic: "small"})
	big := bigBody()
	replies := publish(t, p, []outbox.Message{msg(1, "k", big), msg(2, "k", "{}")})
	if r := replies[0]; r.OK() || !r.Retryable || outbox.IsOutage(r) {
		t.Errorf("the large record: %+v, want a retryable NACK", r)
	}
	if r := replies[1]; !outbox.IsOutage(r) {
		t.Errorf("the record after it: %+v, want an outage NACK (held back)", r)
	}
	// Sent again alone, the small one passes.
	if r := publish(t, p, []outbox.Message{msg(2, "k", "{}")})[0]; !r.OK() {
		t.Errorf("the small record alone: %+v", r)
	}
}

// bigBody returns 8,000 bytes of JSON that do not compress below the
// topics' 2,000 bytes.
func bigBody() string {
	b := make([]byte, 6000)
	rand.Read(b)
	return `{"x":"` + base64.StdEncoding.EncodeToString(b) + `"}`
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []outboxkafka.Config{
		{Topic: "orders"},
		{Brokers: []string{"127.0.0.1:1"}},
		{Brokers: []string{"127.0.0.1:1"}, Topic: "or ders"},
		{Brokers: []string{"127.0.0.1:1"}, Topic: ".."},
		{Brokers: []string{"127.0.0.1:1"}, Topic: "orders", MaxRecordBytes: -1},
	} {
		if p, err := outboxkafka.New(cfg); err == nil {
			p.Close()
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestTraceHeaders: a message's trace context becomes the record's
// traceparent and tracestate headers; without one there are none.
func TestTraceHeaders(t *testing.T) {
	p, err := outboxkafka.New(outboxkafka.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	m := msg(1, "corr", "{}")
	r := p.Record(m)
	if header(r, outboxkafka.HeaderTraceParent) != "" {
		t.Errorf("a message without a trace context: headers %v", r.Headers)
	}
	m.TraceParent, m.TraceState = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v"
	r = p.Record(m)
	if header(r, "traceparent") != m.TraceParent || header(r, "tracestate") != "k=v" {
		t.Errorf("headers %v, want traceparent and tracestate", r.Headers)
	}
}
