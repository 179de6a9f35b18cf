package server_test

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/stdwebhook"
)

const hardeningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// sign returns the Standard Webhooks headers of body sent as id at at.
func sign(t *testing.T, id string, at time.Time, body string) map[string]string {
	t.Helper()
	k, err := stdwebhook.ParseSecret(hardeningSecret)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"Webhook-Id": id, "Webhook-Timestamp": fmt.Sprint(at.Unix()), "Webhook-Signature": stdwebhook.Sign(k, id, at, []byte(body))}
}

func with(h map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestSignedWebhookIdentity: with a signing secret, a webhook's key is
// its signed webhook-id and its type comes from its signed body: one
// captured delivery resent with new Idempotency-Keys and an X-Event-Type
// is the same webhook (200, stored once, its type unchanged), and a
// replay outside the timestamp tolerance, late or early, is refused.
func TestSignedWebhookIdentity(t *testing.T) {
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Secrets: []string{hardeningSecret}}}, nil)
	body := `{"type": "user.created", "data": {"id": 7}}`
	captured := sign(t, "msg_1", time.Now(), body)
	status, first, _ := post(t, ts, body, captured)
	if status != http.StatusAccepted || first["idempotency_key"] != "msg_1" {
		t.Fatalf("signed: %d %v", status, first)
	}
	for _, extra := range []map[string]string{
		{"Idempotency-Key": "new1"},
		{"Idempotency-Key": "new2", "X-Event-Type": "admin.grant"},
		{"X-Event-Type": "admin.grant"},
	} {
		status, got, _ := post(t, ts, body, with(captured, flatten(extra)...))
		if status != http.StatusOK || got["id"] != first["id"] || got["idempotency_key"] != "msg_1" {
			t.Errorf("the captured delivery resent with %v: %d %v, want 200, the first webhook", extra, status, got)
		}
	}
	if _, st := call(t, ts, "GET", "/v1/streams/webhooks", ""); st["events"] != 1.0 {
		t.Fatalf("the webhooks stream holds %v events, want 1", st["events"])
	}
	if _, got := call(t, ts, "GET", "/webhooks/"+fmt.Sprint(first["id"]), ""); got["type"] != "user.created" {
		t.Fatalf("stored type %v, want the signed body's user.created", got["type"])
	}
	for _, key := range []string{"new1", "new2"} {
		if status, _ := call(t, ts, "GET", "/webhooks?idempotency_key="+key, ""); status != http.StatusNotFound {
			t.Errorf("a webhook was stored under the unsigned key %s", key)
		}
	}

	// A body without a type: "webhook", whatever the headers say.
	untyped := `{"data": {"id": 8}}`
	status, got, _ := post(t, ts, untyped, with(sign(t, "msg_2", time.Now(), untyped), "X-Event-Type", "admin.grant"))
	if status != http.StatusAccepted {
		t.Fatalf("signed, untyped: %d %v", status, got)
	}
	if _, got := call(t, ts, "GET", "/webhooks/"+fmt.Sprint(got["id"]), ""); got["type"] != "webhook" {
		t.Fatalf("an unsigned X-Event-Type set the type of a signed webhook: %v", got["type"])
	}

	for name, at := range map[string]time.Time{"6 minutes late": time.Now().Add(-6 * time.Minute), "6 minutes early": time.Now().Add(6 * time.Minute)} {
		status, got, _ := post(t, ts, body, sign(t, "msg_3", at, body))
		if status != http.StatusUnauthorized || !strings.Contains(fmt.Sprint(got), "outside the tolerance") {
			t.Errorf("a replay signed %s: %d %v, want 401 naming the tolerance", name, status, got)
		}
	}
}

// TestSignedWebhookFields: with a signing secret, the configured key and
// type fields of the signed body are used; the key and type headers are
// not.
func TestSignedWebhookFields(t *testing.T) {
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Secrets: []string{hardeningSecret}, KeyField: "id", TypeField: "kind",
		KeyHeader: "X-Delivery", TypeHeader: "X-Kind"}}, nil)
	body := `{"id": "evt_1", "kind": "charge.succeeded", "type": "ignored"}`
	status, got, _ := post(t, ts, body, with(sign(t, "msg_1", time.Now(), body), "X-Delivery", "d-1", "X-Kind", "admin.grant"))
	if status != http.StatusAccepted || got["idempotency_key"] != "evt_1" {
		t.Fatalf("signed with fields: %d %v", status, got)
	}
	if _, got := call(t, ts, "GET", "/webhooks/"+fmt.Sprint(got["id"]), ""); got["type"] != "charge.succeeded" {
		t.Fatalf("type %v, want the signed field kind", got["type"])
	}
}

func flatten(m map[string]string) []string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k, v)
	}
	return kv
}

// TestWebhookKeyAndTypeText: an idempotency key or type that is not
// valid UTF-8 or holds a control character is refused with 400 naming
// where it came from, so that distinct keys cannot merge; one of
// whitespace only is missing; a type is at most 128 bytes, as on the
// WebSocket.
func TestWebhookKeyAndTypeText(t *testing.T) {
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{KeyField: "id", TypeField: "kind"}}, nil)
	for _, c := range []struct {
		body    string
		headers map[string]string
		code    string
		names   string
	}{
		{`{}`, map[string]string{"Idempotency-Key": "k\xff1"}, "invalid_field", "Idempotency-Key header: not valid UTF-8"},
		{`{}`, map[string]string{"Idempotency-Key": "k\t1"}, "invalid_field", "Idempotency-Key header: holds the control character U+0009"},
		{`{}`, map[string]string{"Webhook-Id": "msg\xc3"}, "invalid_field", "Webhook-Id header: not valid UTF-8"},
		{`{"id": "a\u0000b"}`, nil, "invalid_field", `field "id": holds the control character U+0000`},
		{`{"id": "a\ud800b"}`, nil, "invalid_field", `field "id": holds U+FFFD`},
		{"{\"id\": \"a\xffb\"}", nil, "invalid_field", `field "id": not valid UTF-8`},
		{`{}`, map[string]string{"Idempotency-Key": "k1", "X-Event-Type": "order\u0085paid"}, "invalid_field", "X-Event-Type header: holds the control character U+0085"},
		{`{"kind": "a\u001bb"}`, map[string]string{"Idempotency-Key": "k1"}, "invalid_field", `field "kind": holds the control character U+001B`},
		{`{}`, map[string]string{"Idempotency-Key": "k1", "X-Event-Type": strings.Repeat("t", 129)}, "invalid_field", "X-Event-Type header: 129 bytes, at most 128"},
		{`{"kind": "` + strings.Repeat("t", 200) + `"}`, map[string]string{"Idempotency-Key": "k1"}, "invalid_field", `field "kind": 200 bytes, at most 128`},
		{`{}`, map[string]string{"Idempotency-Key": "   "}, "missing_field", "idempotency key"},
		{`{"id": " \t "}`, nil, "missing_field", "idempotency key"},
		{`{"id": "a", "id": "b"}`, nil, "invalid_field", `field "id": appears twice`},
		{`{"id": "a", "\u0069d": "b"}`, nil, "invalid_field", `field "id": appears twice`},
		{`{"kind": {"x": 1}}`, map[string]string{"Idempotency-Key": "k1"}, "invalid_field", `field "kind": want a string or a number, got a JSON object`},
		{`{"id": ["a"]}`, nil, "invalid_field", `field "id": want a string or a number, got a JSON array`},
	} {
		status, got, _ := post(t, ts, c.body, c.headers)
		if status != http.StatusBadRequest || errorCode(got) != c.code || !strings.Contains(fmt.Sprint(got), c.names) {
			t.Errorf("%q %q: %d %v, want 400 %s naming %q", c.body, c.headers, status, got, c.code, c.names)
		}
	}
	if _, st := call(t, ts, "GET", "/v1/streams/webhooks", ""); st["events"] != 0.0 {
		t.Fatalf("refused webhooks were stored: %v events", st["events"])
	}
	if status, got, _ := post(t, ts, `{}`, map[string]string{"Idempotency-Key": "clé-1", "X-Event-Type": strings.Repeat("t", 128)}); status != http.StatusAccepted {
		t.Fatalf("a UTF-8 key and a 128-byte type: %d %v", status, got)
	}
}

// TestWebhookMetadataBounds: only the headers a handler needs (provider
// ids, events, signatures) are kept with a webhook, each value and all of
// them bounded; a flood of other headers is not stored.
func TestWebhookMetadataBounds(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	h := map[string]string{"Idempotency-Key": "flood", "X-GitHub-Event": "push", "Authorization": "Bearer x", "X-Api-Key": "secret"}
	for i := range 40 {
		h[fmt.Sprintf("X-Junk-%d", i)] = strings.Repeat("j", 500)
	}
	if status, got, _ := post(t, ts, `{}`, h); status != http.StatusAccepted {
		t.Fatalf("20 KB of headers: %d %v", status, got)
	}
	var meta string
	if err := ts.Store().ReadDB().QueryRow(`SELECT metadata_json FROM stream_events WHERE source_native_id = 'flood'`).Scan(&meta); err != nil {
		t.Fatal(err)
	}
	var m struct{ Headers map[string]string }
	if err := json.Unmarshal([]byte(meta), &m); err != nil {
		t.Fatal(err)
	}
	if len(meta) > 1024 || m.Headers["x-github-event"] != "push" || m.Headers["authorization"] != "" || m.Headers["x-api-key"] != "" || m.Headers["x-junk-0"] != "" {
		t.Fatalf("metadata of %d bytes: %s", len(meta), meta)
	}

	big := map[string]string{"Idempotency-Key": "big", "X-Hub-Signature-256": "sha256=" + strings.Repeat("a", 3000)}
	if status, got, _ := post(t, ts, `{}`, big); status != http.StatusBadRequest || !strings.Contains(fmt.Sprint(got), "header X-Hub-Signature-256: 3007 bytes, at most 2048") {
		t.Fatalf("a 3 KB signature header: %d %v", status, got)
	}
	many := map[string]string{"Idempotency-Key": "many"}
	for i := range 10 {
		many[fmt.Sprintf("X-GitHub-Pad-%d", i)] = strings.Repeat("p", 1000)
	}
	if status, got, _ := post(t, ts, `{}`, many); status != http.StatusBadRequest || !strings.Contains(fmt.Sprint(got), "exceed 8192 bytes") {
		t.Fatalf("10 KB of kept headers: %d %v", status, got)
	}
}

// gzipTarget is a target that decodes a gzip Content-Encoding as a
// correct server does (a plain body under that header is a 400) and
// records the headers it got.
type gzipTarget struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newGzipTarget(t *testing.T) *gzipTarget {
	g := &gzipTarget{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.headers = append(g.headers, r.Header.Clone())
		g.mu.Unlock()
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, "body is not gzip: "+err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		data, err := io.ReadAll(body)
		if err != nil || !json.Valid(data) {
			http.Error(w, "body is not JSON", http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(g.Close)
	return g
}

// TestWebhookForwardsAllowList: the workers send a target only the
// headers of a webhook that describe the event (provider ids, events,
// signatures, tracing), never the sender's credentials, the first hop's
// headers or its Content-Encoding: a webhook sent with Content-Encoding:
// gzip on a plain body completes at a correct target.
func TestWebhookForwardsAllowList(t *testing.T) {
	tg := newGzipTarget(t)
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{Target: tg.URL + "/in"}, Delivery: fastRetries}, nil)
	sent := map[string]string{
		"Idempotency-Key": "gh-1", "X-Event-Type": "push",
		// kept and forwarded
		"X-GitHub-Event": "push", "X-GitHub-Delivery": "72d3162e", "X-Hub-Signature-256": "sha256=abc", "Stripe-Signature": "t=1,v1=x",
		"Webhook-Id": "msg_1", "X-Request-Id": "req-1", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		// never forwarded
		"X-Api-Key": "secret", "Authorization": "Bearer upstream", "Cookie": "session=1", "Proxy-Authorization": "Basic eA==",
		"X-Forwarded-For": "10.0.0.1", "X-Forwarded-Host": "internal", "X-Forwarded-Proto": "http", "Forwarded": "for=10.0.0.1",
		"X-Real-Ip": "10.0.0.1", "X-HTTP-Method-Override": "DELETE", "Content-Encoding": "gzip", "X-Custom-Secret": "s",
	}
	status, body, _ := post(t, ts, `{"ref": "main"}`, sent)
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %v", status, body)
	}
	var got map[string]any
	waitFor(t, 10*time.Second, "the webhook to be settled", func() bool {
		_, got = call(t, ts, "GET", "/webhooks/"+fmt.Sprint(body["id"]), "")
		return got["attempts"] == 1.0 && got["status"] != delivery.StateProcessing
	})
	if got["status"] != delivery.StateCompleted {
		t.Fatalf("the webhook is %v after its first attempt: %v", got["status"], got["last_error"])
	}
	tg.mu.Lock()
	h := tg.headers[0]
	tg.mu.Unlock()
	for _, name := range []string{"X-Api-Key", "Authorization", "Cookie", "Proxy-Authorization", "X-Forwarded-For", "X-Forwarded-Host",
		"X-Forwarded-Proto", "Forwarded", "X-Real-Ip", "X-Http-Method-Override", "Content-Encoding", "X-Custom-Secret"} {
		if v := h.Get(name); v != "" {
			t.Errorf("the target got %s: %s", name, v)
		}
	}
	for name, want := range map[string]string{"X-Github-Event": "push", "X-Github-Delivery": "72d3162e", "X-Hub-Signature-256": "sha256=abc",
		"Stripe-Signature": "t=1,v1=x", "Webhook-Id": "msg_1", "X-Request-Id": "req-1", "Traceparent": sent["Traceparent"],
		"Idempotency-Key": "gh-1", "X-Event-Type": "push", "Content-Type": "application/json", "User-Agent": "postbox"} {
		if v := h.Get(name); v != want {
			t.Errorf("the target got %s: %q, want %q", name, v, want)
		}
	}
}

// TestSubscriptionTargetPolicy: the API refuses a target at a link-local
// address (the cloud metadata service) with 400 naming it, on create and
// on PATCH.
func TestSubscriptionTargetPolicy(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	const want = "target address 169.254.169.254 is link-local: refused (--allow-link-local-targets)"
	status, got := call(t, ts, "POST", "/v1/subscriptions", `{"name":"meta","source":"webhooks","target":"http://169.254.169.254/latest/meta-data/"}`)
	if status != http.StatusBadRequest || errorCode(got) != "invalid_field" || !strings.Contains(fmt.Sprint(got), want) {
		t.Fatalf("create: %d %v", status, got)
	}
	status, got = call(t, ts, "PATCH", "/v1/subscriptions/webhooks", `{"target":"http://[fe80::1]:8080/"}`)
	if status != http.StatusBadRequest || errorCode(got) != "invalid_field" || !strings.Contains(fmt.Sprint(got), "fe80::1 is link-local") {
		t.Fatalf("patch: %d %v", status, got)
	}
}
