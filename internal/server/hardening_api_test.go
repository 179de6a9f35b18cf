package server_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
)

// goWords are what a Go type name or a Go error leaks into a message.
var goWords = regexp.MustCompile(`struct|int64|float64|\*string|map\[|\[\]|json:|reflect|interface|time\.Duration`)

// TestAPIBoundsAndNames: every duration and size of the operator API is
// bounded, every name checked, and a body of the wrong shape is refused
// in plain words: each bad input gets 400 with a JSON error naming the
// field, and changes nothing.
func TestAPIBoundsAndNames(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	req, _ := http.NewRequest("POST", ts.Base+"/webhooks", strings.NewReader(`{"a":1}`))
	req.Header.Set("Idempotency-Key", "bounds-1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	status, lease := call(t, ts, "POST", "/v1/inboxes/webhooks/lease", `{"max":1,"wait":"10s"}`)
	items, _ := lease["items"].([]any)
	if status != 200 || len(items) != 1 {
		t.Fatalf("lease the webhook: %d %v", status, lease)
	}
	id := items[0].(map[string]any)["id"]
	tok := lease["lease"].(string)
	settle := func(extra string) string { return fmt.Sprintf(`{"ids":[%v],"lease":%q%s}`, id, tok, extra) }
	long := func(n int) string { return strings.Repeat("a", n) }
	many := func(n int, f func(i int) string) string {
		var parts []string
		for i := range n {
			parts = append(parts, f(i))
		}
		return strings.Join(parts, ",")
	}
	for _, c := range []struct {
		method, path, body string
		field              string // the message names it
	}{
		// durations
		{"POST", "/v1/inboxes/webhooks/lease", `{"visibility_timeout":"1000000h"}`, "visibility_timeout"},
		{"POST", "/v1/inboxes/webhooks/lease", `{"visibility_timeout":"13h"}`, "visibility_timeout"},
		{"POST", "/v1/inboxes/webhooks/lease", `{"visibility_timeout":30}`, "visibility_timeout"},
		{"POST", "/v1/inboxes/webhooks/lease", `{"wait":"-1s"}`, "wait"},
		{"POST", "/v1/inboxes/webhooks/lease", `{"wait":true}`, "wait"},
		{"POST", "/v1/inboxes/webhooks/lease", `{"max":1e30}`, "max"},
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"delay":"1000000h"`), "delay"},
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"delay":"25h"`), "delay"},
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"delay":{}`), "delay"},
		// sizes and text
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"reason":"` + long(1025) + `"`), "reason"},
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"reason":"bad\u0000reason"`), "reason"},
		{"POST", "/v1/inboxes/webhooks/ack", fmt.Sprintf(`{"ids":[%v],"lease":%q}`, id, long(300)), "lease"},
		{"POST", "/v1/inboxes/webhooks/ack", `{"ids":"1"}`, "ids"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","types":[` + many(101, func(i int) string { return fmt.Sprintf(`"t%d"`, i) }) + `]}`, "types"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","types":["` + long(129) + `"]}`, "types"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","types":["a\u0001b"]}`, "types"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","types":[1]}`, "types"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","metadata":{` + many(33, func(i int) string { return fmt.Sprintf(`"k%d":"v"`, i) }) + `}}`, "metadata"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","metadata":{"k":"` + long(1025) + `"}}`, "metadata"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","metadata":{"k":1}}`, "metadata"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","target":"http://x/` + long(2048) + `"}`, "target"},
		{"PATCH", "/v1/subscriptions/webhooks", `{"target":"http://x/` + long(2048) + `"}`, "target"},
		// names
		{"POST", "/v1/subscriptions", `{"name":"a\u0000b","source":"webhooks"}`, "name"},
		{"POST", "/v1/subscriptions", `{"name":"` + long(129) + `","source":"webhooks"}`, "name"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"web hooks"}`, "source"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","inbox":"a\u0000b"}`, "inbox"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"webhooks","inbox":"a/b"}`, "inbox"},
		{"POST", "/v1/inboxes/a%00b/lease", `{}`, "inbox"},
		{"POST", "/v1/inboxes/a%00b/ack", settle(""), "inbox"},
		{"POST", "/v1/inboxes/a%00b/nack", settle(""), "inbox"},
		{"GET", "/v1/inboxes/a%00b/items", ``, "inbox"},
		{"GET", "/v1/inboxes/" + long(129) + "/items", ``, "inbox"},
		{"GET", "/v1/inboxes/a%20b/items/1", ``, "inbox"},
		{"GET", "/v1/subscriptions/a%00b", ``, "subscription"},
		{"PATCH", "/v1/subscriptions/a%00b", `{"target":null}`, "subscription"},
		{"DELETE", "/v1/subscriptions/a%00b", ``, "subscription"},
		{"GET", "/v1/streams/a%00b", ``, "stream"},
		{"GET", "/v1/dead-letters?inbox=a%00b", ``, "inbox"},
		{"GET", "/v1/dead-letters?subscription=a%20b", ``, "subscription"},
		{"POST", "/v1/dead-letters/replay", `{"subscription":"a\u0000b"}`, "subscription"},
		// bodies of the wrong shape
		{"POST", "/v1/subscriptions", `[]`, "body"},
		{"POST", "/v1/subscriptions", `"name"`, "body"},
		{"POST", "/v1/inboxes/webhooks/lease", `[1,2]`, "body"},
		{"POST", "/v1/inboxes/webhooks/nack", `17`, "body"},
		{"POST", "/v1/dead-letters/replay", `[{"all":true}]`, "body"},
		{"PATCH", "/v1/subscriptions/webhooks", `[]`, "body"},
	} {
		status, body := call(t, ts, c.method, c.path, c.body)
		e, _ := body["error"].(map[string]any)
		msg, _ := e["message"].(string)
		name := c.body
		if len(name) > 60 {
			name = name[:60] + "…"
		}
		if status != 400 || !strings.Contains(msg, c.field) {
			t.Errorf("%s %.80s %s: %d %v, want 400 naming %q", c.method, c.path, name, status, body, c.field)
		}
		if goWords.MatchString(msg) {
			t.Errorf("%s %.80s %s: the message speaks Go: %q", c.method, c.path, name, msg)
		}
	}
	// Nothing changed: one subscription (the default), the item still
	// held by its lease, never nacked or acked.
	if _, body := call(t, ts, "GET", "/v1/subscriptions", ""); len(body["subscriptions"].([]any)) != 1 {
		t.Errorf("refused requests created subscriptions: %v", body)
	}
	status, it := call(t, ts, "GET", fmt.Sprintf("/v1/inboxes/webhooks/items/%v", id), "")
	if status != 200 || it["state"] != "processing" || it["last_error"] != nil || it["target"] != nil {
		t.Errorf("the leased item after refused requests: %d %v, want processing without last_error", status, it)
	}
	if _, sub := call(t, ts, "GET", "/v1/subscriptions/webhooks", ""); sub["target"] != nil {
		t.Errorf("a refused PATCH set a target: %v", sub)
	}
	// Within the bounds, the same requests work.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/inboxes/webhooks/lease", `{"visibility_timeout":"12h","wait":"0s"}`},
		{"POST", "/v1/inboxes/webhooks/nack", settle(`,"delay":"24h","reason":"` + long(1024) + `"`)},
	} {
		if status, body := call(t, ts, c.method, c.path, c.body); status != 200 {
			t.Errorf("%s %s at the bounds: %d %v", c.method, c.path, status, body)
		}
	}
}
