package outboxredis

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
)

// wireArgs returns the arguments go-redis sends for the XADD of m, without
// a server: a pipeline queues the command and keeps them.
func wireArgs(t *testing.T, p *Publisher, m outbox.Message, idmp bool) []any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	return c.Pipeline().XAdd(context.Background(), p.xaddArgs(m, idmp)).Args()
}

func TestXAddArgs(t *testing.T) {
	m := outbox.Message{
		EventID: "evt_1", Type: "order.created", Body: []byte(`{"a":1}`),
		CorrelationID: "corr_1", TenantID: "t1",
		CreatedAt: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC),
	}
	unused := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer unused.Close()
	fields := []any{
		"event_id", "evt_1", "type", "order.created", "payload", []byte(`{"a":1}`),
		"correlation_id", "corr_1", "tenant_id", "t1", "created_at", "2030-01-02T03:04:05.000000006Z",
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		idmp bool
		want []any
	}{
		{"plain", Config{Stream: "s"}, false, append([]any{"xadd", "s", "*"}, fields...)},
		{"maxlen", Config{Stream: "s", MaxLen: 1000}, false, append([]any{"xadd", "s", "maxlen", "~", int64(1000), "*"}, fields...)},
		// XADD key [IDMPAUTO pid | IDMP pid iid] [MAXLEN|MINID [=|~] threshold] <* | id> field value ...
		{"idmp", Config{Stream: "s"}, true, append([]any{"xadd", "s", "idmp", DefaultProducerID, "evt_1", "*"}, fields...)},
		{"idmp maxlen producer", Config{Stream: "s", MaxLen: 10, ProducerID: "relay-a"}, true,
			append([]any{"xadd", "s", "idmp", "relay-a", "evt_1", "maxlen", "~", int64(10), "*"}, fields...)},
	} {
		p, err := NewPublisher(unused, tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := wireArgs(t, p, m, tc.idmp)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.name, got, tc.want)
		}
	}
	// Without a tenant the field is left out.
	m.TenantID = ""
	p, _ := NewPublisher(unused, Config{Stream: "s"})
	if got := wireArgs(t, p, m, false); slices.Contains(got, any("tenant_id")) {
		t.Errorf("no tenant: %v", got)
	}
}

func TestSupportsIDMP(t *testing.T) {
	for v, want := range map[string]bool{
		"8.6.0": true, "8.6.1": true, "8.10.0": true, "9.0.0": true, "10.2": true,
		"8.4.0": false, "8.2.3": false, "7.0.15": false, "7.2.4": false, "6.2.14": false,
		"": false, "garbage": false, "8": false, "8.x.0": false,
	} {
		if got := supportsIDMP(v); got != want {
			t.Errorf("supportsIDMP(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestInfoField(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\nredis_mode:standalone\r\n"
	if got := infoField(info, "redis_version"); got != "7.0.15" {
		t.Errorf("redis_version = %q", got)
	}
	if got := infoField(info, "redis"); got != "" {
		t.Errorf("a prefix of a name matched: %q", got)
	}
	if got := infoField(info, "valkey_version"); got != "" {
		t.Errorf("absent field = %q", got)
	}
}

// On this machine's Redis (7.0.15 when this was written) the version is
// read once and IDMP stays off.
func TestDetectsVersionOfRealServer(t *testing.T) {
	opt, err := redis.ParseURL(testenv.URL(t, testenv.Redis))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	version := infoField(info, "redis_version")
	p, _ := NewPublisher(c, Config{Stream: "s"})
	idmp, err := p.useIDMP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !p.detected || idmp != supportsIDMP(version) {
		t.Fatalf("redis_version %s: detected %v, idmp %v", version, p.detected, idmp)
	}
	t.Logf("redis_version %s: IDMP %v", version, idmp)
}

// TestTraceFields: a message's trace context is written as the
// traceparent and tracestate fields, and a Consumer reads it back.
func TestTraceFields(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	unused := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer unused.Close()
	p, _ := NewPublisher(unused, Config{Stream: "s"})
	m := outbox.Message{EventID: "evt_1", Type: "t", Body: []byte(`{}`), TraceParent: tp, TraceState: "k=v"}
	args := p.xaddArgs(m, false)
	values := map[string]any{}
	vs := args.Values.([]any)
	for i := 0; i+1 < len(vs); i += 2 {
		v := vs[i+1]
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		values[vs[i].(string)] = v
	}
	got, err := parseEntry(redis.XMessage{ID: "1-0", Values: values})
	if err != nil || got.TraceParent != tp || got.TraceState != "k=v" {
		t.Fatalf("read back %+v, %v; want the trace context", got, err)
	}
	m.TraceParent, m.TraceState = "", ""
	if got := wireArgs(t, p, m, false); slices.Contains(got, any("traceparent")) {
		t.Errorf("no trace context: %v", got)
	}
}
