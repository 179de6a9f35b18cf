package poll_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/testenv"
)

// runPoller runs a poller of cfg until the test ends (or the returned
// stop is called).
func runPoller(t *testing.T, cfg poll.Config) (stop func()) {
	t.Helper()
	p, err := poll.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestPollerEndlessAnswer: an answer that does not end (chunked, or with
// a Content-Length over the limit) is cut at the page limit, the budget's
// reserve, and the poll fails naming the limit; the budget it took is
// given back each time, and a poller of a normal API sharing the budget
// goes on storing.
func TestPollerEndlessAnswer(t *testing.T) {
	const reserve = 256 << 10
	var maxUsed atomic.Int64
	var b *budget.Budget
	b = budget.New(1<<20, reserve, func(int64) {
		for u := b.Used(); u > maxUsed.Load(); {
			if maxUsed.CompareAndSwap(maxUsed.Load(), u) {
				break
			}
		}
	})
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/declared" {
			w.Header().Set("Content-Length", strconv.Itoa(100<<20))
		}
		fmt.Fprint(w, `{"events":[`)
		item := []byte(`{"id":"x","type":"t","pad":"` + strings.Repeat("p", 1000) + `"},`)
		for r.Context().Err() == nil {
			if _, err := w.Write(item); err != nil {
				return
			}
		}
	}))
	defer endless.Close()
	normal := fakeAPI(50, 20, nil)
	defer normal.Close()
	reg := prometheus.NewRegistry()
	m := poll.NewMetrics(reg)
	var stops []func()
	var sinks []*memSink
	for _, path := range []string{"/chunked", "/declared", "/chunked"} {
		sink := &memSink{byID: map[string]int{}}
		sinks = append(sinks, sink)
		stops = append(stops, runPoller(t, poll.Config{Name: "endless" + path, Sink: sink, Budget: b, Metrics: m,
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			Settings: poll.Settings{URL: endless.URL + path, Items: ptr("/events"), ID: "/id", Type: "/type", Interval: "10ms"}}))
	}
	fine := &memSink{byID: map[string]int{}}
	s := settingsFor(normal.URL)
	s.Headers = nil
	stops = append(stops, runPoller(t, poll.Config{Name: "fine", Sink: fine, Budget: b, Metrics: m, Settings: s}))
	testenv.Eventually(t, 30*time.Second, "three cut answers of each endless source and every item of the normal one", func() bool {
		ids, _ := fine.state()
		return counter(t, reg, "postbox_poll_errors_total", "too_large") >= 9 && len(ids) == 1000
	})
	for i, sink := range sinks {
		_, cp := sink.state()
		if want := fmt.Sprintf("an answer larger than %d bytes, the limit of one page", reserve); !strings.Contains(cp.LastError, want) {
			t.Errorf("source %d: last error %q, want %q", i, cp.LastError, want)
		}
	}
	for _, stop := range stops {
		stop()
	}
	if u := b.Used(); u != 0 {
		t.Errorf("%d bytes of the budget still taken after the pollers stopped", u)
	}
	if u := maxUsed.Load(); u > b.Size() {
		t.Errorf("%d bytes taken at most, over the budget of %d", u, b.Size())
	}
}

// TestPollerUnchangedPage: an API that answers the same page at every
// poll (no cursor) has it decoded and stored once; the polls after that
// only record the poll in the checkpoint, until the page changes.
func TestPollerUnchangedPage(t *testing.T) {
	var body atomic.Value
	body.Store(`{"events":[{"id":"1","type":"a"},{"id":"2","type":"a"}]}`)
	var requests atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fmt.Fprint(w, body.Load())
	}))
	defer api.Close()
	sink := &memSink{byID: map[string]int{}}
	reg := prometheus.NewRegistry()
	runPoller(t, poll.Config{Name: "same", Sink: sink, Metrics: poll.NewMetrics(reg),
		Settings: poll.Settings{URL: api.URL, Items: ptr("/events"), ID: "/id", Type: "/type", Interval: "10ms"}})
	testenv.Eventually(t, 10*time.Second, "five polls", func() bool { return requests.Load() >= 5 && sink.commitCount() >= 5 })
	ids, cp := sink.state()
	if ids["1"] != 1 || ids["2"] != 1 {
		t.Fatalf("the same page was stored again: %v", ids)
	}
	if cp.LastPollAt.IsZero() || cp.LastError != "" {
		t.Errorf("checkpoint %+v", cp)
	}
	if n := counter(t, reg, "postbox_poll_unchanged_total", ""); n < 3 {
		t.Errorf("unchanged_total = %v, want ≥ 3", n)
	}
	body.Store(`{"events":[{"id":"1","type":"a"},{"id":"2","type":"a"},{"id":"3","type":"a"}]}`)
	testenv.Eventually(t, 10*time.Second, "the changed page stored", func() bool { ids, _ := sink.state(); return ids["3"] == 1 })
}

// TestPollerChunkedAnswer: an answer without a Content-Length, read in
// pooled chunks, is decoded byte for byte: one over several chunks, not
// a multiple of them, and one of exactly the page limit.
func TestPollerChunkedAnswer(t *testing.T) {
	page := func(n int) string {
		var sb strings.Builder
		sb.WriteString(`{"events":[`)
		for i := range n {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"id":"%d","type":"t","pad":"%s"}`, i, strings.Repeat("x", 1000+i%7))
		}
		sb.WriteString(`]}`)
		return sb.String()
	}
	big := page(700) // about 700 KB: three chunks and part of a fourth
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := big
		if r.URL.Path == "/exact" {
			body = page(3)
		}
		for i := 0; i < len(body); i += 4000 {
			w.Write([]byte(body[i:min(len(body), i+4000)]))
			w.(http.Flusher).Flush() // chunked: no Content-Length
		}
	}))
	defer api.Close()
	for _, c := range []struct {
		path  string
		limit int64
		items int
	}{{"/big", 0, 700}, {"/exact", int64(len(page(3))), 3}} {
		sink := &memSink{byID: map[string]int{}}
		stop := runPoller(t, poll.Config{Name: "chunked", Sink: sink, MaxPageBytes: c.limit,
			Settings: poll.Settings{URL: api.URL + c.path, Items: ptr("/events"), ID: "/id", Type: "/type", Interval: "1h"}})
		testenv.Eventually(t, 10*time.Second, "the page stored", func() bool { return sink.commitCount() >= 1 })
		stop()
		ids, cp := sink.state()
		if len(ids) != c.items || cp.LastError != "" {
			t.Errorf("%s: %d items stored, want %d; last error %q", c.path, len(ids), c.items, cp.LastError)
		}
	}
}
