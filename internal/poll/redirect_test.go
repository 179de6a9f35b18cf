package poll_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestPollerRedirects: an upstream that answers 302 to another loopback
// port (another origin) does not get the source's headers there, nor any
// request: the poll fails naming the refused origin. A redirect to the
// same origin is followed with the headers; with redirects "none" it is
// not followed either.
func TestPollerRedirects(t *testing.T) {
	var elsewhere atomic.Int64 // requests the other origin received
	var leaked atomic.Value
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		leaked.Store(r.Header.Get("X-Api-Key") + "|" + r.Header.Get("Authorization"))
		fmt.Fprint(w, `{"events":[{"id":"stolen","type":"a"}]}`)
	}))
	defer other.Close()
	var keyAtMoved atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away":
			http.Redirect(w, r, other.URL+"/events?page=2", http.StatusFound)
		case "/here":
			http.Redirect(w, r, "/moved", http.StatusFound)
		case "/moved":
			keyAtMoved.Store(r.Header.Get("X-Api-Key") + "|" + r.Header.Get("Authorization"))
			fmt.Fprint(w, `{"events":[{"id":"1","type":"a"}]}`)
		}
	}))
	defer upstream.Close()
	env := func(k string) (string, bool) { return "Bearer from-env", k == "UPSTREAM_TOKEN" }
	run := func(t *testing.T, path, redirects string) *memSink {
		t.Helper()
		s := poll.Settings{URL: upstream.URL + path, Items: ptr("/events"), ID: "/id", Type: "/type", Interval: "10ms",
			Headers: map[string]string{"X-Api-Key": "k3y", "Authorization": "env:UPSTREAM_TOKEN"}, Redirects: redirects}
		sink := &memSink{byID: map[string]int{}}
		p, err := poll.New(poll.Config{Name: "r", Settings: s, Sink: sink, LookupEnv: env,
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return sink
	}
	for _, redirects := range []string{"", "same-origin", "none"} {
		t.Run("another origin, redirects "+redirects, func(t *testing.T) {
			sink := run(t, "/away", redirects)
			testenv.Eventually(t, 10*time.Second, "three polls", func() bool { return sink.commitCount() >= 3 })
			if n := elsewhere.Load(); n != 0 {
				t.Fatalf("the other origin received %d requests (X-Api-Key|Authorization: %v)", n, leaked.Load())
			}
			_, cp := sink.state()
			host := strings.TrimPrefix(other.URL, "http://")
			if !strings.Contains(cp.LastError, "redirect not followed") || !strings.Contains(cp.LastError, host) ||
				strings.Contains(cp.LastError, "page=2") {
				t.Errorf("last error %q: want the redirect refused, naming the origin (%s) without its path and query", cp.LastError, host)
			}
		})
	}
	t.Run("same origin", func(t *testing.T) {
		sink := run(t, "/here", "")
		testenv.Eventually(t, 10*time.Second, "the item behind the redirect stored", func() bool {
			ids, _ := sink.state()
			return ids["1"] > 0
		})
		if got := keyAtMoved.Load(); got != "k3y|Bearer from-env" {
			t.Errorf("headers at the same origin's redirect: %v", got)
		}
	})
	t.Run("same origin, redirects none", func(t *testing.T) {
		keyAtMoved.Store("")
		sink := run(t, "/here", "none")
		testenv.Eventually(t, 10*time.Second, "the redirect refused", func() bool {
			_, cp := sink.state()
			return strings.Contains(cp.LastError, "redirect not followed") && strings.Contains(cp.LastError, "redirects: none")
		})
		if ids, _ := sink.state(); len(ids) != 0 || keyAtMoved.Load() != "" {
			t.Errorf("followed a redirect with redirects none: %v", ids)
		}
	})
	if err := (poll.Settings{URL: "http://x/", Items: ptr(""), ID: "/id", Type: "/type", Redirects: "any"}).Validate(); err == nil ||
		!strings.Contains(err.Error(), `settings.redirects "any"`) {
		t.Errorf("redirects any: %v", err)
	}
}
