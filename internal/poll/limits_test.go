package poll_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestPollerLimits: items over the limits a WebSocket envelope or a
// webhook is refused for (a payload nested 5,000 deep, a 10,000-byte id,
// a 10,000-byte type) are refused one by one, counted, logged and named
// in the checkpoint's last error; the valid items of the same page are
// stored, and the page is not asked for again.
func TestPollerLimits(t *testing.T) {
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	page := fmt.Sprintf(`{"events":[{"id":"ok1","type":"a"},{"id":"deep","type":"a","x":%s},{"id":"%s","type":"a"},`+
		`{"id":"longtype","type":"%s"},{"id":"ok2","type":"a"}]}`, deep, strings.Repeat("i", 10000), strings.Repeat("t", 10000))
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, page) }))
	defer api.Close()
	sink := &memSink{byID: map[string]int{}}
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	p, err := poll.New(poll.Config{Name: "lim", Sink: sink, Metrics: poll.NewMetrics(reg), Logger: testLogger(&logs),
		Settings: poll.Settings{URL: api.URL, Items: ptr("/events"), ID: "/id", Type: "/type", Interval: "1h"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "the page committed", func() bool { return sink.commitCount() >= 1 })
	cancel()
	<-done
	ids, cp := sink.state()
	if len(ids) != 2 || ids["ok1"] != 1 || ids["ok2"] != 1 {
		t.Fatalf("stored %d ids (%.300v), want ok1 and ok2 alone", len(ids), ids)
	}
	for _, want := range []string{`item 1 (id "deep") refused: payload: arrays and objects nested 5001 deep, at most 1000`,
		"(and 2 more items refused)"} {
		if !strings.Contains(cp.LastError, want) {
			t.Errorf("last error %q: want %q", cp.LastError, want)
		}
	}
	if n := counter(t, reg, "postbox_poll_items_total", "refused"); n != 3 {
		t.Errorf(`items_total{result="refused"} = %v, want 3`, n)
	}
	for _, want := range []string{"id: 10000 bytes, over the limit of 255", "type: 10000 bytes, over the limit of 128", "nested 5001 deep"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%.2000s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), strings.Repeat("i", 100)) {
		t.Error("the log holds the whole 10,000-byte id")
	}
}

// testLogger logs in text to w, safe for concurrent use.
func testLogger(w *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(&lockedWriter{w: w}, nil))
}

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// counter returns the value of the series of name in reg whose result
// (or reason) label is label ("": its first series).
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if (l.GetName() == "result" || l.GetName() == "reason") && l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
