package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// leaseOne leases the one item of inbox and returns it.
func leaseOne(t *testing.T, ts *servertest.Server, inbox string) map[string]any {
	t.Helper()
	var items []any
	waitFor(t, 10*time.Second, "an item in "+inbox, func() bool {
		_, lease := srcCall(t, ts, "POST", "/v1/inboxes/"+inbox+"/lease", `{"max":10}`, nil)
		items, _ = lease["items"].([]any)
		return len(items) > 0
	})
	if len(items) != 1 {
		t.Fatalf("%d items leased in %s, want 1", len(items), inbox)
	}
	return items[0].(map[string]any)
}

// sameJSON fails unless got (decoded) is the JSON want.
func sameJSON(t *testing.T, what string, got any, want string) {
	t.Helper()
	var w any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if g, _ := json.Marshal(got); string(g) != func() string { b, _ := json.Marshal(w); return string(b) }() {
		t.Fatalf("%s: %s, want %s", what, g, want)
	}
}

// TestDeliveryHandleAPI: a GitHub source's webhook gets its delivery
// handle at intake, under the source's api_url, and the pull API shows
// it on the item; a device's event shows the handle its device_id and
// session_id make; the source shows its reply settings redacted; a
// device source refuses reply settings, and bad handle settings are
// refused naming the field.
func TestDeliveryHandleAPI(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	const secret = "gh handle secret"
	st, src := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["`+secret+`"],
		"api_url": "http://127.0.0.1:1/api/v3", "reply": {"headers": {"Authorization": "token s3cret", "X-Token": "env:GH_TOKEN"}}}}`, nil)
	if st != 201 {
		t.Fatalf("create gh: %d %v", st, src)
	}
	settings, _ := src["settings"].(map[string]any)
	reply, _ := settings["reply"].(map[string]any)
	headers, _ := reply["headers"].(map[string]any)
	if settings["api_url"] != "http://127.0.0.1:1/api/v3" || headers["X-Token"] != "env:GH_TOKEN" || !strings.HasPrefix(fmt.Sprint(headers["Authorization"]), "hmac:") {
		t.Fatalf("the source's settings %v: want its api_url, and its reply headers redacted", settings)
	}
	if st, body := srcCall(t, ts, "POST", "/v1/subscriptions", `{"name": "gh-all", "source": "gh", "start": "earliest"}`, nil); st != 201 {
		t.Fatalf("a subscription on gh: %d %v", st, body)
	}
	body := `{"action":"created","issue":{"number":12},"comment":{"id":3},"repository":{"full_name":"o/r"}}`
	if st, w := srcCall(t, ts, "POST", "/webhooks/gh", body, map[string]string{"X-GitHub-Delivery": "d-1", "X-GitHub-Event": "issue_comment",
		"X-Hub-Signature-256": webhooksig.SignGitHub(secret, []byte(body))}); st != 202 {
		t.Fatalf("webhook: %d %v", st, w)
	}
	want := `{"kind":"github","repository":"o/r","issue":12,"url":"http://127.0.0.1:1/api/v3/repos/o/r/issues/12/comments"}`
	sameJSON(t, "the leased item's delivery_handle", leaseOne(t, ts, "gh-all")["delivery_handle"], want)
	_, ev := srcCall(t, ts, "GET", "/v1/streams/gh/events/1", "", nil)
	sameJSON(t, "the event's delivery_handle", ev["delivery_handle"], want)

	if st, body := srcCall(t, ts, "POST", "/v1/subscriptions", `{"name": "dev", "source": "devices", "start": "earliest"}`, nil); st != 201 {
		t.Fatalf("a subscription on devices: %d %v", st, body)
	}
	send(t, dial(t, ts.WS, client.Options{}), message(t, envelope("evt_handle_1", "pi-9", `{}`)))
	wantDev := `{"kind":"device","device_id":"pi-9","session_id":"sess-1"}`
	sameJSON(t, "the device item's delivery_handle", leaseOne(t, ts, "dev")["delivery_handle"], wantDev)
	_, ev = srcCall(t, ts, "GET", "/v1/streams/devices/events/1", "", nil)
	sameJSON(t, "the device event's delivery_handle", ev["delivery_handle"], wantDev)

	// The default source's settings come from serve's flags; its reply
	// settings are its own, shown redacted.
	if st, src := srcCall(t, ts, "POST", "/v1/sources", `{"name": "flags", "kind": "webhook", "settings": {"serve_flags": true,
		"reply": {"signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}`, nil); st != 201 ||
		!strings.HasPrefix(fmt.Sprint(src["settings"].(map[string]any)["reply"]), "map[signing_secret:hmac:") {
		t.Fatalf("a serve_flags source with reply settings: %d %v", st, src)
	}
	for _, c := range []struct{ settings, field string }{
		{`{"kind": "device", "settings": {"reply": {"headers": {"A": "b"}}}}`, "settings.reply: postbox cannot reply to a device"},
		{`{"kind": "webhook", "settings": {"handle_header": "X-A", "handle_pointer": "/a"}}`, "settings.handle_header and settings.handle_pointer"},
		{`{"kind": "webhook", "settings": {"handle_pointer": "a"}}`, "settings.handle_pointer: JSON pointer"},
		{`{"kind": "webhook", "settings": {"preset": "stripe", "secrets": ["s"], "api_url": "https://u:p@api.stripe.com"}}`, "settings.api_url: no credentials"},
		{`{"kind": "webhook", "settings": {"reply": {"headers": {"Host": "x"}}}}`, "settings.reply.headers: Host is set by postbox"},
		{`{"kind": "poll", "settings": {"url": "http://127.0.0.1:1/e", "items": "", "id": "/id", "type": "/t", "handle": {"url": "reply"}}}`, "settings.handle.url: JSON pointer"},
	} {
		st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "bad", `+c.settings[1:], nil)
		if st != 400 || errorCode(body) != "invalid_field" || !strings.HasPrefix(errorMessage(body), c.field) {
			t.Errorf("%s: %d %v, want 400 invalid_field %q", c.settings, st, body, c.field)
		}
	}
}

// TestPollSourceHandle: a poll source's handle setting gives each stored
// item the handle its pointers find, through the source runner and the
// stream backend.
func TestPollSourceHandle(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"items":[{"id":"a","type":"msg","links":{"reply":"https://chat.example/r/a"},"room":7},{"id":"b","type":"msg"}]}`)
	}))
	t.Cleanup(api.Close)
	ts := servertest.Start(t, server.Config{}, nil)
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "chat", "kind": "poll", "settings": {"url": "`+api.URL+`/e",
		"items": "/items", "id": "/id", "type": "/type", "interval": "1h", "handle": {"url": "/links/reply", "room": "/room"}}}`, nil); st != 201 {
		t.Fatalf("create: %d %v", st, body)
	}
	waitFor(t, 10*time.Second, "both items stored", func() bool { return len(storedPayloads(t, ts, "chat")) == 2 })
	_, ev := srcCall(t, ts, "GET", "/v1/streams/chat/events/1", "", nil)
	sameJSON(t, "item a's delivery_handle", ev["delivery_handle"], `{"kind":"poll","room":7,"url":"https://chat.example/r/a"}`)
	_, ev = srcCall(t, ts, "GET", "/v1/streams/chat/events/2", "", nil)
	if ev["delivery_handle"] != nil {
		t.Fatalf("item b: delivery_handle %v, want null", ev["delivery_handle"])
	}
}
