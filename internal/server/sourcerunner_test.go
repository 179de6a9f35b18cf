package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// pagedAPI serves items 1..n by ?after= in pages of per, with
// next_cursor until the last page, and counts the requests.
func pagedAPI(t *testing.T, n, per int, requests *atomic.Int64) *httptest.Server {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Header.Get("Authorization") != "Bearer from-env" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		var items []string
		for i := after + 1; i <= min(after+per, n); i++ {
			items = append(items, fmt.Sprintf(`{"id":"e%d","kind":"push","at":%d}`, i, 1700000000+i))
		}
		next := "null"
		if after+per < n {
			next = strconv.Quote(strconv.Itoa(after + per))
		}
		fmt.Fprintf(w, `{"data":{"items":[%s]},"next":%s}`, strings.Join(items, ","), next)
	}))
	t.Cleanup(api.Close)
	return api
}

// TestPollSource: a source of kind poll created through the API starts
// polling at once, stores every item once in its stream in the
// transaction of its checkpoint, shows the checkpoint and its settings
// without the header's value, and stops polling when deleted.
func TestPollSource(t *testing.T) {
	t.Setenv("POLL_TEST_TOKEN", "Bearer from-env")
	var requests atomic.Int64
	api := pagedAPI(t, 250, 100, &requests)
	ts := servertest.Start(t, server.Config{}, nil)
	st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh", "kind": "poll", "settings": {"url": "`+api.URL+`/events",
		"items": "/data/items", "id": "/id", "type": "/kind", "time": "/at", "cursor_param": "after", "next": "/next",
		"interval": "50ms", "headers": {"Authorization": "env:POLL_TEST_TOKEN", "X-Literal": "s3cret-literal"}}}`, nil)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	raw, _ := json.Marshal(body)
	if strings.Contains(string(raw), "from-env") || strings.Contains(string(raw), "s3cret-literal") || !strings.Contains(string(raw), "env:POLL_TEST_TOKEN") {
		t.Errorf("the API shows the headers as %s", raw)
	}
	testenv.Eventually(t, 20*time.Second, "250 items and the checkpoint at the last page", func() bool {
		_, src := srcCall(t, ts, "GET", "/v1/sources/gh", "", nil)
		cp, _ := src["checkpoint"].(map[string]any)
		return len(storedPayloads(t, ts, "gh")) == 250 && cp["cursor"] == "200"
	})
	_, src := srcCall(t, ts, "GET", "/v1/sources/gh", "", nil)
	cp := src["checkpoint"].(map[string]any)
	if cp["last_event_at"] != time.Unix(1700000250, 0).UTC().Format(time.RFC3339) || cp["last_error"] != nil || cp["last_poll_at"] == nil {
		t.Errorf("checkpoint %v", cp)
	}
	if p := storedPayloads(t, ts, "gh")["e7"]; p != `{"id":"e7","kind":"push","at":1700000007}` {
		t.Errorf("e7 stored as %s", p)
	}
	if st, body := srcCall(t, ts, "DELETE", "/v1/sources/gh", "", nil); st != 204 {
		t.Fatalf("delete: %d %v", st, body)
	}
	// Deleting stops the poller (the next rescan at the latest) and its
	// checkpoint does not come back.
	testenv.Eventually(t, 10*time.Second, "the poller to stop", func() bool {
		n := requests.Load()
		time.Sleep(3 * intake.DefaultRescanInterval / 2)
		return requests.Load() == n
	})
	if st, _ := srcCall(t, ts, "GET", "/v1/sources/gh", "", nil); st != 404 {
		t.Errorf("after delete: %d", st)
	}
}

// TestUpstreamSourceBadInput: poll and feed sources with missing or bad
// settings are 400 naming the field.
func TestUpstreamSourceBadInput(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	for _, c := range []struct{ body, want, code string }{
		{`{"name": "p", "kind": "poll"}`, "settings: required", "missing_field"},
		{`{"name": "p", "kind": "poll", "settings": {"url": "http://x/e", "id": "/id", "type": "/t"}}`, "settings.items: required", "missing_field"},
		{`{"name": "p", "kind": "poll", "settings": {"url": "http://x/e", "items": "/e", "type": "/t"}}`, "settings.id: required", "missing_field"},
		{`{"name": "p", "kind": "poll", "settings": {"url": "http://x/e", "items": "e", "id": "/id", "type": "/t"}}`, `settings.items: JSON pointer "e": starts with /`, ""},
		{`{"name": "p", "kind": "poll", "settings": {"url": "nope", "items": "/e", "id": "/id", "type": "/t"}}`, `settings.url "nope"`, ""},
		{`{"name": "p", "kind": "poll", "settings": {"url": "http://x/e", "items": "/e", "id": "/id", "type": "/t", "bogus": 1}}`, `unknown field "bogus"`, "unknown_field"},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://x:8000/"}}`, "settings.url", ""},
		{`{"name": "f", "kind": "feed", "settings": {}}`, "settings.url: required", "missing_field"},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://x:8000/v1/streams/x?after=5"}}`, "no query or fragment", ""},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://x:8000/v1/streams/.."}}`, "the stream's name", ""},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://x:8000/v1/streams/a%20b"}}`, "the stream's name", ""},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://u:pw@x:8000/v1/streams/devices"}}`, "no credentials in the URL", ""},
		{`{"name": "f", "kind": "carrier-pigeon"}`, "use webhook, poll, feed", ""},
		{`{"name": "p", "kind": "poll", "settings": {"url": "http://169.254.169.254/latest", "items": "/e", "id": "/id", "type": "/t"}}`,
			"169.254.169.254 is link-local: refused (--allow-link-local-targets)", ""},
		{`{"name": "f", "kind": "feed", "settings": {"url": "http://[fe80::1]:8000/v1/streams/devices"}}`, "is link-local: refused", ""},
	} {
		if c.code == "" {
			c.code = "invalid_field"
		}
		st, body := srcCall(t, ts, "POST", "/v1/sources", c.body, nil)
		if st != 400 || !strings.Contains(errorMessage(body), c.want) || errorCode(body) != c.code {
			t.Errorf("%s: %d %s %q, want 400 %s with %q", c.body, st, errorCode(body), errorMessage(body), c.code, c.want)
		}
	}
}

// TestUpstreamSourceTargetPolicy: a poll source reaches only what the
// server's target policy allows, checked on the address its host name
// resolved to when it connects: with --deny-private-targets a poll of
// localhost never reaches it and its checkpoint says why.
func TestUpstreamSourceTargetPolicy(t *testing.T) {
	var requests atomic.Int64
	api := pagedAPI(t, 10, 10, &requests)
	ts := servertest.Start(t, server.Config{Delivery: delivery.Config{DenyPrivateTargets: true}}, nil)
	url := strings.Replace(api.URL, "127.0.0.1", "localhost", 1) + "/events"
	st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "p", "kind": "poll", "settings": {"url": "`+url+`",
		"items": "/data/items", "id": "/id", "type": "/kind", "interval": "50ms"}}`, nil)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	testenv.Eventually(t, 20*time.Second, "the refusal in the checkpoint", func() bool {
		_, src := srcCall(t, ts, "GET", "/v1/sources/p", "", nil)
		cp, _ := src["checkpoint"].(map[string]any)
		msg, _ := cp["last_error"].(string)
		return strings.Contains(msg, "is loopback: refused (--deny-private-targets)")
	})
	if n := requests.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests through the policy", n)
	}
}

// TestFeedSourceError: a feed source whose upstream does not answer
// records the failure in its checkpoint's last_error, and its token is
// shown as a fingerprint.
func TestFeedSourceError(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close() // nothing listens there now
	ts := servertest.Start(t, server.Config{}, nil)
	st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "mirror", "kind": "feed", "settings": {"url": "`+url+`/v1/streams/devices", "token": "t0ps3cret"}}`, nil)
	if st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	raw, _ := json.Marshal(body)
	if strings.Contains(string(raw), "t0ps3cret") || !strings.Contains(string(raw), `"token":"hmac:`) {
		t.Errorf("the API shows the feed source as %s", raw)
	}
	testenv.Eventually(t, 20*time.Second, "the connection failure in the checkpoint", func() bool {
		_, src := srcCall(t, ts, "GET", "/v1/sources/mirror", "", nil)
		cp, _ := src["checkpoint"].(map[string]any)
		msg, _ := cp["last_error"].(string)
		return strings.Contains(msg, "connect to "+url)
	})
}
