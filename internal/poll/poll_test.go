package poll_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
)

// TestPointer runs the examples of RFC 6901, section 5.
func TestPointer(t *testing.T) {
	doc := json.RawMessage(`{"foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3, "g|h": 4, "i\\j": 5,
		"k\"l": 6, " ": 7, "m~n": 8, "o": {"p": [{"q": "deep"}]}}`)
	for ptr, want := range map[string]string{
		"/foo": `["bar", "baz"]`, "/foo/0": `"bar"`, "/": `0`, "/a~1b": `1`, "/c%d": `2`, "/e^f": `3`,
		"/g|h": `4`, "/i\\j": `5`, "/k\"l": `6`, "/ ": `7`, "/m~0n": `8`, "/o/p/0/q": `"deep"`,
	} {
		p, err := poll.ParsePointer(ptr)
		if err != nil {
			t.Fatalf("%q: %v", ptr, err)
		}
		got, ok, err := p.Find(doc)
		if err != nil || !ok || string(got) != want {
			t.Errorf("%q: %s, %v, %v; want %s", ptr, got, ok, err, want)
		}
	}
	if got, ok, _ := (poll.Pointer{}).Find(doc); !ok || string(got) != string(doc) {
		t.Errorf(`"": %s, want the whole document`, got)
	}
	for _, ptr := range []string{"/nope", "/foo/2", "/foo/01", "/foo/-", "/foo/x", "/o/p/0/q/r"} {
		p, _ := poll.ParsePointer(ptr)
		if got, ok, err := p.Find(doc); ok || err != nil {
			t.Errorf("%q: %s, %v, %v; want nothing", ptr, got, ok, err)
		}
	}
	for _, bad := range []string{"events", "/a~2", "/a~"} {
		if _, err := poll.ParsePointer(bad); err == nil {
			t.Errorf("%q: parsed", bad)
		}
	}
}

func ptr(s string) *string { return &s }

func TestSettingsValidate(t *testing.T) {
	good := poll.Settings{URL: "https://api.example.com/events?per_page=100", Items: ptr("/events"), ID: "/id", Type: "/type",
		Time: "/created_at", CursorParam: "after", Next: "/next_cursor", Interval: "5s",
		Headers: map[string]string{"Authorization": "env:GH_TOKEN"}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit func(*poll.Settings)
		want string
	}{
		{func(s *poll.Settings) { s.URL = "" }, "settings.url: required"},
		{func(s *poll.Settings) { s.URL = "ftp://x/y" }, `settings.url "ftp://x/y"`},
		{func(s *poll.Settings) { s.URL = "http:///events" }, "settings.url"},
		{func(s *poll.Settings) { s.URL = "https://me:pw@api.example.com/events" }, "settings.url: no credentials in the URL"},
		{func(s *poll.Settings) { s.Items = nil }, "settings.items: required"},
		{func(s *poll.Settings) { s.ID = "" }, "settings.id: required"},
		{func(s *poll.Settings) { s.Type = "" }, "settings.type: required"},
		{func(s *poll.Settings) { s.ID = "id" }, `settings.id: JSON pointer "id": starts with /`},
		{func(s *poll.Settings) { s.Time = "/a~3" }, "settings.time: JSON pointer"},
		{func(s *poll.Settings) { s.Next = "" }, "settings.cursor_param and settings.next go together"},
		{func(s *poll.Settings) { s.Interval = "soon" }, `settings.interval "soon"`},
		{func(s *poll.Settings) { s.Interval = "1ns" }, `settings.interval "1ns"`},
		{func(s *poll.Settings) { s.Headers = map[string]string{"Bad Name": "x"} }, `settings.headers: "Bad Name" is not a header name`},
		{func(s *poll.Settings) { s.Headers = map[string]string{"Authorization": "env:"} }, "settings.headers.Authorization: env: names no variable"},
	} {
		s := good
		c.edit(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", s, err, c.want)
		}
	}
	if name, v, err := poll.ParseHeader("authorization: env:GH_TOKEN"); err != nil || name != "Authorization" || v != "env:GH_TOKEN" {
		t.Errorf("ParseHeader: %q %q %v", name, v, err)
	}
	if _, _, err := poll.ParseHeader("no colon"); err == nil {
		t.Error("ParseHeader without a colon: no error")
	}
}

// memSink stores events by id in memory and records the checkpoints.
type memSink struct {
	mu      sync.Mutex
	byID    map[string]int
	cp      poll.Checkpoint
	commits int
	fail    func(n int) error // when set, called with the commit's number
	full    atomic.Bool
}

func (m *memSink) Commit(_ context.Context, events []stream.Event, cp poll.Checkpoint) ([]stream.AppendResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.commits++
	if m.fail != nil {
		if err := m.fail(m.commits); err != nil {
			return nil, err
		}
	}
	res := make([]stream.AppendResult, len(events))
	for i, e := range events {
		res[i].Duplicate = m.byID[e.NativeID] > 0
		m.byID[e.NativeID]++
	}
	m.cp = cp
	return res, nil
}

func (m *memSink) Full(int) bool { return m.full.Load() }

func (m *memSink) state() (map[string]int, poll.Checkpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.byID {
		out[k] = v
	}
	return out, m.cp
}

// fakeAPI serves items 1..pages*per in pages of per by ?after=, each
// page with next_cursor, and the last one without.
func fakeAPI(pages, per int, misbehave func(w http.ResponseWriter, r *http.Request, page int) bool) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		page := after / per
		if misbehave != nil && misbehave(w, r, page) {
			return
		}
		type item struct {
			ID        int    `json:"id"`
			Type      string `json:"type"`
			CreatedAt string `json:"created_at"`
		}
		var out struct {
			Events []item  `json:"events"`
			Next   *string `json:"next_cursor"`
		}
		out.Events = []item{}
		for i := after + 1; i <= min(after+per, pages*per); i++ {
			out.Events = append(out.Events, item{i, "push", time.Unix(1700000000+int64(i), 0).UTC().Format(time.RFC3339)})
		}
		if after+per < pages*per {
			n := strconv.Itoa(after + per)
			out.Next = &n
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(out)
	}))
}

func settingsFor(url string) poll.Settings {
	return poll.Settings{URL: url + "/events", Items: ptr("/events"), ID: "/id", Type: "/type", Time: "/created_at",
		CursorParam: "after", Next: "/next_cursor", Interval: "20ms", Headers: map[string]string{"Authorization": "env:TEST_TOKEN"}}
}

// TestPollerPages: every item of 20 pages is stored once although a 429
// with Retry-After, a 500, a page the sink fails to store and a header
// whose variable is missing at first come in between; the checkpoint ends
// at the last page's cursor with the last item's time and no error.
func TestPollerPages(t *testing.T) {
	var throttled, broke atomic.Bool
	var auth atomic.Value
	api := fakeAPI(20, 50, func(w http.ResponseWriter, r *http.Request, page int) bool {
		auth.Store(r.Header.Get("Authorization"))
		switch {
		case page == 5 && throttled.CompareAndSwap(false, true):
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		case page == 9 && broke.CompareAndSwap(false, true):
			http.Error(w, "boom", http.StatusInternalServerError)
			return true
		}
		return false
	})
	defer api.Close()
	sink := &memSink{byID: map[string]int{}, fail: func(n int) error {
		if n == 4 {
			return errors.New("disk full")
		}
		return nil
	}}
	var envSet atomic.Bool
	p, err := poll.New(poll.Config{Name: "gh", Settings: settingsFor(api.URL), Sink: sink,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond,
		LookupEnv: func(k string) (string, bool) {
			if k != "TEST_TOKEN" || !envSet.Swap(true) {
				return "", false // unset at the first poll
			}
			return "Bearer t0ken", true
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, "every item stored and the checkpoint at the last page", func() bool {
		ids, cp := sink.state()
		return len(ids) == 1000 && cp.Cursor == "950"
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ids, cp := sink.state()
	for i := 1; i <= 1000; i++ {
		if ids[strconv.Itoa(i)] < 1 {
			t.Fatalf("item %d not stored", i)
		}
	}
	if !throttled.Load() || !broke.Load() {
		t.Error("the API never throttled or failed")
	}
	if auth.Load() != "Bearer t0ken" {
		t.Errorf("Authorization sent: %v", auth.Load())
	}
	if want := time.Unix(1700001000, 0).UTC(); !cp.LastEventAt.Equal(want) || cp.LastError != "" || cp.LastPollAt.IsZero() {
		t.Errorf("checkpoint %+v, want last event at %v and no error", cp, want)
	}
}

// TestPollerDecodeError: a page with an item without an id, or one that
// is not UTF-8, is not skipped: the poller asks for it again, records
// the error in the checkpoint, and stores it once the API serves it whole.
func TestPollerDecodeError(t *testing.T) {
	for _, c := range []struct{ name, broken, want string }{
		{"no id", `{"events":[{"type":"a"}],"next_cursor":"2"}`, `item 0: no id at "/id"`},
		{"not UTF-8", "{\"events\":[{\"id\":2,\"type\":\"a\",\"x\":\"\xff\"}],\"next_cursor\":\"2\"}", "not valid UTF-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fixed atomic.Bool
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("after") == "" {
					fmt.Fprint(w, `{"events":[{"id":1,"type":"a"}],"next_cursor":"1"}`)
					return
				}
				if !fixed.Load() {
					fmt.Fprint(w, c.broken)
					return
				}
				fmt.Fprint(w, `{"events":[{"id":2,"type":"a"}],"next_cursor":null}`)
			}))
			defer api.Close()
			sink := &memSink{byID: map[string]int{}}
			s := settingsFor(api.URL)
			s.Headers = nil
			p, err := poll.New(poll.Config{Name: "x", Settings: s, Sink: sink, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go p.Run(ctx)
			testenv.Eventually(t, 10*time.Second, "the decode error in the checkpoint", func() bool {
				_, cp := sink.state()
				return strings.Contains(cp.LastError, c.want)
			})
			if _, cp := sink.state(); cp.Cursor != "1" {
				t.Fatalf("checkpoint %+v: moved past the page it could not read", cp)
			}
			fixed.Store(true)
			testenv.Eventually(t, 10*time.Second, "the page stored once served whole", func() bool {
				ids, cp := sink.state()
				return ids["2"] == 1 && cp.LastError == ""
			})
		})
	}
}

// TestPollerSaturated: while the sink's queue is full the poller asks
// for nothing.
func TestPollerSaturated(t *testing.T) {
	var requests atomic.Int64
	api := fakeAPI(1, 10, func(http.ResponseWriter, *http.Request, int) bool { requests.Add(1); return false })
	defer api.Close()
	sink := &memSink{byID: map[string]int{}}
	sink.full.Store(true)
	s := settingsFor(api.URL)
	s.Headers = nil
	p, _ := poll.New(poll.Config{Name: "x", Settings: s, Sink: sink, Metrics: poll.NewMetrics(nil)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	// The poller is waiting for room; give it a moment to (wrongly) ask.
	<-time.After(200 * time.Millisecond)
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests while the writer's queue was full", n)
	}
	sink.full.Store(false)
	testenv.Eventually(t, 10*time.Second, "items stored once there is room", func() bool { ids, _ := sink.state(); return len(ids) == 10 })
	cancel()
	<-done
}

func (m *memSink) commitCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.commits
}
