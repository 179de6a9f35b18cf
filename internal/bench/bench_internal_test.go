package bench

import (
	"encoding/json"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Quantiles weigh each frame's latency by its envelopes.
func TestLatenciesQuantile(t *testing.T) {
	var l latencies
	if got := l.quantile(0.5); got != 0 {
		t.Errorf("no samples: quantile %v, want 0", got)
	}
	l.add(10*time.Millisecond, 1)
	l.add(1*time.Millisecond, 98)
	l.add(50*time.Millisecond, 1)
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0.5, 1}, {0.98, 1}, {0.99, 10}, {1, 50}} {
		if got := l.quantile(tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v ms, want %v", tc.q, got, tc.want)
		}
	}
}

func TestParseWriterStats(t *testing.T) {
	page := `# HELP postbox_writer_commit_seconds ...
postbox_writer_commit_seconds_sum 1.5
postbox_writer_commit_seconds_count 30
postbox_writer_batch_events_sum 600
postbox_writer_batch_events_count 30
`
	ws, err := parseWriterStats("u", page)
	if err != nil || ws != (writerStats{commits: 30, entries: 600, seconds: 1.5}) {
		t.Errorf("parseWriterStats = %+v, %v", ws, err)
	}
	if _, err := parseWriterStats("u", "postbox_writer_commit_seconds_count x\n"); err == nil || !strings.Contains(err.Error(), "postbox_writer_commit_seconds_count") {
		t.Errorf("a bad value: err %v, want one naming the metric", err)
	}
}

// A postgres:// spec without ?schema= gets the run's schema, and the drop
// connects without postbox's option; any other spec is left alone.
func TestOwnSchema(t *testing.T) {
	spec, drop := ownSchema("postgres://u:p@h/db?sslmode=disable", "bench_x")
	u, err := url.Parse(spec)
	if err != nil || u.Query().Get("schema") != "bench_x" || u.Query().Get("sslmode") != "disable" || drop == nil {
		t.Errorf("ownSchema = %q (drop %v)", spec, drop != nil)
	}
	for _, s := range []string{"sqlite", "", "postgres://h/db?schema=mine", "nats://h:4222"} {
		if got, drop := ownSchema(s, "bench_x"); got != s || drop != nil {
			t.Errorf("ownSchema(%q) = %q (drop %v), want it unchanged", s, got, drop != nil)
		}
	}
}

func TestWithPrefix(t *testing.T) {
	if got := withPrefix("nats://h:4222", "P_"); got != "nats://h:4222?prefix=P_" {
		t.Errorf("got %q", got)
	}
	if got := withPrefix("kafka://h:9092?replication_factor=1", "b."); got != "kafka://h:9092?replication_factor=1&prefix=b." {
		t.Errorf("got %q", got)
	}
}

// Redis and NATS targets get a stream of the run's own; others are used
// as given; a kafka:// target without a topic is a usage error.
func TestRelayTarget(t *testing.T) {
	for _, tc := range []struct{ to, want string }{
		{"redis://h:6379/0?stream=ev", "redis://h:6379/0?stream=ev-postbox-bench-7"},
		{"nats://h:4222?stream=EV", "nats://h:4222?stream=EV_postbox_bench_7"},
		{"redis://h:6379/0", "redis://h:6379/0"},
		{"ws://h:8080", "ws://h:8080"},
	} {
		got, clean, err := relayTarget(tc.to, "postbox_bench_7")
		if err != nil || got != tc.want || clean == nil {
			t.Errorf("relayTarget(%q) = %q, %v; want %q", tc.to, got, err, tc.want)
		}
	}
	_, _, err := relayTarget("kafka://u:secret@h:9092", "postbox_bench_7")
	var ue *UsageError
	if !errors.As(err, &ue) || strings.Contains(err.Error(), "secret") {
		t.Errorf("kafka without topic: err %v, want a usage error without the password", err)
	}
}

func TestResultChecks(t *testing.T) {
	ok := IngestResult{Events: 10, Acked: 10, Stored: 10}
	if err := ok.Check(); err != nil {
		t.Errorf("all acked and stored: %v", err)
	}
	unchecked := IngestResult{Events: 10, Acked: 10, Stored: -1}
	if err := unchecked.Check(); err != nil {
		t.Errorf("store not checked: %v", err)
	}
	for _, bad := range []IngestResult{{Events: 10, Acked: 9, Stored: -1}, {Events: 10, Acked: 10, Stored: 9}, {Events: 10, Acked: 10, Stored: 10, Duplicates: 1}} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v: Check passed", bad)
		}
	}
	wh := WebhooksResult{Requests: 3, Statuses: map[string]int64{"202": 2, "200": 1, "429": 5}, Stored: 3}
	if err := wh.Check(); err != nil {
		t.Errorf("webhooks all answered: %v", err)
	}
	wh.Statuses["202"] = 1
	if err := wh.Check(); err == nil {
		t.Error("webhooks: one unanswered, Check passed")
	}
}

// The JSON field names are the ones BENCHMARKS.md and scripts read.
func TestResultFieldNames(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want []string
	}{
		{IngestResult{}, []string{"events_per_s", "ack_p99_ms", "stored", "duplicates_stored", "peak_rss_mb", "server"}},
		{WebhooksResult{}, []string{"accepted_per_s", "baseline_per_s", "ratio", "statuses", "writer_busy"}},
		{DeliveryResult{}, []string{"items_per_sec", "posts", "store", "streams"}},
		{RelayRound{}, []string{"relays", "events_per_s", "delivered"}},
	} {
		b, _ := json.Marshal(tc.v)
		var m map[string]any
		json.Unmarshal(b, &m)
		for _, k := range tc.want {
			if _, ok := m[k]; !ok {
				t.Errorf("%T: no %q in %s", tc.v, k, b)
			}
		}
	}
}

func TestPayloadSizes(t *testing.T) {
	for _, n := range []int{300, 1000} {
		if got := len(agentPayload(n)); got != n {
			t.Errorf("agentPayload(%d): %d bytes", n, got)
		}
		if got := len(webhookPayload(n)); got != n {
			t.Errorf("webhookPayload(%d): %d bytes", n, got)
		}
		if !json.Valid(agentPayload(n)) || !json.Valid(webhookPayload(n)) {
			t.Errorf("payloads of %d bytes are not JSON", n)
		}
	}
}
