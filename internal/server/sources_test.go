package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// srcCall sends method path with a JSON body (none when "") and headers to
// ts, and returns the status and the decoded answer (nil for none).
func srcCall(t *testing.T, ts *servertest.Server, method, path, body string, headers map[string]string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.Base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: %d, body is not JSON: %s", method, path, resp.StatusCode, data)
		}
	}
	return resp.StatusCode, out
}

func errorMessage(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	msg, _ := e["message"].(string)
	return msg
}

// storedPayloads returns the payloads of the stream's events by
// idempotency key, as stored.
func storedPayloads(t *testing.T, ts *servertest.Server, streamID string) map[string]string {
	t.Helper()
	ctx := context.Background()
	st, err := ts.Srv.Streams().Stats(ctx, streamID)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for off := st.FirstOffset; off >= 1 && off <= st.LastOffset; off++ {
		ev, err := ts.Srv.Streams().Event(ctx, streamID, off)
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := out[ev.NativeID]; dup {
			t.Fatalf("stream %s holds %s twice", streamID, ev.NativeID)
		}
		out[ev.NativeID] = string(ev.Payload)
	}
	return out
}

// TestGitHubSource: a github source verifies X-Hub-Signature-256 over
// the exact body with its secret, takes the key and type from GitHub's
// headers, stores a pretty-printed body byte for byte, once, and answers
// its compact redelivery as a duplicate; a wrong or missing signature is
// 401 naming the header.
func TestGitHubSource(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	const secret = "gh webhook secret"
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["old secret", "`+secret+`"]}}`, nil); st != 201 {
		t.Fatalf("create gh: %d %v", st, body)
	}
	if st, body := srcCall(t, ts, "POST", "/v1/subscriptions", `{"name": "gh-all", "source": "gh", "start": "earliest"}`, nil); st != 201 {
		t.Fatalf("a subscription on gh: %d %v", st, body)
	}
	pretty := "{\n  \"action\": \"opened\",\n  \"issue\": {\"number\": 7}\n}\n"
	compact := `{"action":"opened","issue":{"number":7}}`
	hdr := func(body, secret string) map[string]string {
		return map[string]string{"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958", "X-GitHub-Event": "issues",
			"X-Hub-Signature-256": webhooksig.SignGitHub(secret, []byte(body))}
	}
	st, body := srcCall(t, ts, "POST", "/webhooks/gh", pretty, hdr(pretty, secret))
	if st != 202 || body["idempotency_key"] != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || body["id"] != "wh_gh_1" {
		t.Fatalf("a signed GitHub delivery: %d %v, want 202 with id wh_gh_1", st, body)
	}
	if st, body := srcCall(t, ts, "POST", "/webhooks/gh", compact, hdr(compact, "old secret")); st != 200 || body["id"] != "wh_gh_1" || body["status"] != "pending" && body["status"] != "completed" {
		t.Fatalf("its compact redelivery signed with the older secret: %d %v, want 200 with id wh_gh_1", st, body)
	}
	for name, h := range map[string]map[string]string{
		"wrong secret":    hdr(pretty, "another secret"),
		"other body":      hdr(compact+" ", secret),
		"no signature":    {"X-GitHub-Delivery": "d-2", "X-GitHub-Event": "issues"},
		"sha1 only":       {"X-GitHub-Delivery": "d-3", "X-Hub-Signature": "sha1=0123"},
		"malformed":       {"X-GitHub-Delivery": "d-4", "X-Hub-Signature-256": "sha256=nothex"},
		"standard header": {"X-GitHub-Delivery": "d-5", "webhook-signature": "v1,abc"},
	} {
		st, body := srcCall(t, ts, "POST", "/webhooks/gh", pretty, h)
		if st != 401 || errorCode(body) != "invalid_signature" || !strings.Contains(errorMessage(body), "X-Hub-Signature-256") {
			t.Errorf("%s: %d %v, want 401 invalid_signature naming X-Hub-Signature-256", name, st, body)
		}
	}
	stored := storedPayloads(t, ts, "gh")
	if len(stored) != 1 || stored["72d3162e-cc78-11e3-81ab-4c9367dc0958"] != pretty {
		t.Fatalf("stored: %q, want the pretty body once, byte for byte", stored)
	}
	ev, err := ts.Srv.Streams().Lookup(context.Background(), "gh", "72d3162e-cc78-11e3-81ab-4c9367dc0958", "")
	if err != nil || ev.Type != "issues" {
		t.Fatalf("the stored event: %+v %v, want type issues", ev, err)
	}
	waitFor(t, 10*time.Second, "the item in gh-all", func() bool {
		_, page := srcCall(t, ts, "GET", "/v1/inboxes/gh-all/items", "", nil)
		items, _ := page["items"].([]any)
		return len(items) == 1
	})
	if _, w := srcCall(t, ts, "GET", "/webhooks/wh_1", "", nil); w != nil && w["idempotency_key"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958" {
		t.Fatalf("GET /webhooks/wh_1 (the default source's) shows a webhook of the source gh: %v", w)
	}
	// Looked up by its id or its key in its source, it shows the item of
	// the subscription of the source's name, pending without one.
	for _, path := range []string{"/webhooks/wh_gh_1", "/webhooks?idempotency_key=72d3162e-cc78-11e3-81ab-4c9367dc0958&source=gh"} {
		if st, w := srcCall(t, ts, "GET", path, "", nil); st != 200 || w["id"] != "wh_gh_1" || w["type"] != "issues" || w["status"] != "pending" {
			t.Errorf("GET %s: %d %v, want wh_gh_1, issues, pending", path, st, w)
		}
	}
	for _, path := range []string{"/webhooks/wh_gh_2", "/webhooks/wh_nosuch_1", "/webhooks/wh_devices_1", "/webhooks?idempotency_key=72d3162e-cc78-11e3-81ab-4c9367dc0958",
		"/webhooks?idempotency_key=72d3162e-cc78-11e3-81ab-4c9367dc0958&source=devices"} {
		if st, w := srcCall(t, ts, "GET", path, "", nil); st != 404 || errorCode(w) != "not_found" {
			t.Errorf("GET %s: %d %v, want 404 not_found", path, st, w)
		}
	}
}

// TestStripeSource: a stripe source verifies Stripe-Signature ("t=…,v1=…"
// over "t.body") with a five-minute tolerance, takes the key and type
// from the body's id and type, stores a pretty-printed body once byte for
// byte; a stale or wrong signature is 401 naming the header.
func TestStripeSource(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	const secret = "whsec_stripe_test_secret"
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "stripe", "kind": "webhook", "settings": {"preset": "stripe", "secrets": ["`+secret+`"]}}`, nil); st != 201 {
		t.Fatalf("create stripe: %d %v", st, body)
	}
	pretty := "{\n  \"id\": \"evt_1NG8Du2eZvKYlo2CUI79vXWy\",\n  \"object\": \"event\",\n  \"type\": \"charge.succeeded\"\n}"
	sig := func(body string, at time.Time) map[string]string {
		return map[string]string{"Stripe-Signature": webhooksig.SignStripe(secret, at, []byte(body))}
	}
	st, body := srcCall(t, ts, "POST", "/webhooks/stripe", pretty, sig(pretty, time.Now()))
	if st != 202 || body["idempotency_key"] != "evt_1NG8Du2eZvKYlo2CUI79vXWy" {
		t.Fatalf("a signed Stripe event: %d %v", st, body)
	}
	compact := `{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"charge.succeeded"}`
	if st, body := srcCall(t, ts, "POST", "/webhooks/stripe", compact, sig(compact, time.Now().Add(-time.Minute))); st != 200 {
		t.Fatalf("its compact redelivery: %d %v, want 200", st, body)
	}
	for name, h := range map[string]map[string]string{
		"stale":        sig(pretty, time.Now().Add(-6*time.Minute)),
		"ahead":        sig(pretty, time.Now().Add(6*time.Minute)),
		"other secret": {"Stripe-Signature": webhooksig.SignStripe("whsec_other", time.Now(), []byte(pretty))},
		"missing":      {},
		"malformed":    {"Stripe-Signature": "v1=abc"},
	} {
		st, body := srcCall(t, ts, "POST", "/webhooks/stripe", pretty, h)
		if st != 401 || errorCode(body) != "invalid_signature" || !strings.Contains(errorMessage(body), "Stripe-Signature") {
			t.Errorf("%s: %d %v, want 401 invalid_signature naming Stripe-Signature", name, st, body)
		}
	}
	stored := storedPayloads(t, ts, "stripe")
	if len(stored) != 1 || stored["evt_1NG8Du2eZvKYlo2CUI79vXWy"] != pretty {
		t.Fatalf("stored: %q, want the pretty body once, byte for byte", stored)
	}
	ev, err := ts.Srv.Streams().Lookup(context.Background(), "stripe", "evt_1NG8Du2eZvKYlo2CUI79vXWy", "")
	if err != nil || ev.Type != "charge.succeeded" {
		t.Fatalf("the stored event: %+v %v", ev, err)
	}
	// A signed body without an id has no idempotency key.
	if st, _ := srcCall(t, ts, "POST", "/webhooks/stripe", `{}`, sig(`{}`, time.Now())); st != 400 {
		t.Fatalf("a signed Stripe body without id: %d, want 400", st)
	}
}

// TestWebhookSources: a custom source takes its key and type from its own
// header and field, a Standard Webhooks source verifies with its own
// secret (not the server's), a webhook to an unknown source is 404 and to
// a device source 400; bad settings are 400 naming the field.
func TestWebhookSources(t *testing.T) {
	ts := servertest.Start(t, server.Config{Webhooks: server.WebhookConfig{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}, nil)
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "shop", "kind": "webhook", "settings": {"key_header": "X-Shop-Delivery", "type_field": "topic"}}`, nil); st != 201 {
		t.Fatalf("create shop: %d %v", st, body)
	}
	st, body := srcCall(t, ts, "POST", "/webhooks/shop", `{"topic": "orders/create", "n": 1}`, map[string]string{"X-Shop-Delivery": "s-1"})
	if st != 202 || body["idempotency_key"] != "s-1" {
		t.Fatalf("an unsigned webhook to shop (the server has a secret, shop has none): %d %v", st, body)
	}
	if ev, err := ts.Srv.Streams().Lookup(context.Background(), "shop", "s-1", ""); err != nil || ev.Type != "orders/create" {
		t.Fatalf("shop's event: %+v %v", ev, err)
	}
	if st, body := srcCall(t, ts, "POST", "/webhooks/shop", `{"n": 2}`, nil); st != 400 || !strings.Contains(errorMessage(body), "X-Shop-Delivery") {
		t.Fatalf("no key: %d %v, want 400 naming X-Shop-Delivery", st, body)
	}

	const std = "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ=="
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "std", "kind": "webhook", "settings": {"secrets": ["`+std+`"]}}`, nil); st != 201 {
		t.Fatalf("create std: %d %v", st, body)
	}
	key, _ := stdwebhook.ParseSecret(std)
	now := time.Now()
	payload := `{"type": "user.created"}`
	h := map[string]string{"webhook-id": "msg_1", "webhook-timestamp": strconv.FormatInt(now.Unix(), 10),
		"webhook-signature": stdwebhook.Sign(key, "msg_1", now, []byte(payload))}
	if st, body := srcCall(t, ts, "POST", "/webhooks/std", payload, h); st != 202 || body["idempotency_key"] != "msg_1" {
		t.Fatalf("a Standard Webhooks delivery to std: %d %v", st, body)
	}
	other, _ := stdwebhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	h["webhook-signature"] = stdwebhook.Sign(other, "msg_1", now, []byte(payload))
	if st, body := srcCall(t, ts, "POST", "/webhooks/std", payload, h); st != 401 || !strings.Contains(errorMessage(body), "webhook-signature") {
		t.Fatalf("std signed with the server's secret: %d %v, want 401 naming webhook-signature", st, body)
	}

	if st, body := srcCall(t, ts, "POST", "/webhooks/nowhere", `{}`, map[string]string{"Idempotency-Key": "k"}); st != 404 || errorCode(body) != "not_found" {
		t.Fatalf("a webhook to no source: %d %v", st, body)
	}
	if st, body := srcCall(t, ts, "POST", "/webhooks/devices", `{}`, map[string]string{"Idempotency-Key": "k"}); st != 400 || !strings.Contains(errorMessage(body), "device") {
		t.Fatalf("a webhook to the device source: %d %v, want 400", st, body)
	}
	for _, c := range []struct{ body, field string }{
		{`{"name": "x", "kind": "webhook", "settings": {"preset": "gitlab"}}`, "settings.preset"},
		{`{"name": "x", "kind": "webhook", "settings": {"preset": "stripe"}}`, "settings.secrets"},
		{`{"name": "x", "kind": "webhook", "settings": {"secrets": ["plain"]}}`, "settings.secrets[0]"},
		{`{"name": "x", "kind": "webhook", "settings": {"secrets": ["whsec_bm9wZQ=="]}}`, "settings.secrets[0]: webhook secret: a key of 4 bytes"},
		{`{"name": "x", "kind": "webhook", "settings": {"key_header": "Bad Header"}}`, "settings.key_header"},
		{`{"name": "x", "kind": "webhook", "settings": {"colour": "red"}}`, "colour"},
		{`{"name": "x", "kind": "poll"}`, "settings: required"},
		{`{"name": "x", "kind": "pigeon"}`, `kind "pigeon"`},
		{`{"name": "x", "kind": "device", "settings": {"a": 1}}`, "settings: a device source has none"},
		{`{"name": "x/y", "kind": "webhook"}`, "name"},
		{`{"kind": "webhook"}`, "name"},
		{`{"name": "x"}`, "kind"},
	} {
		if st, body := srcCall(t, ts, "POST", "/v1/sources", c.body, nil); st != 400 || !strings.Contains(errorMessage(body), c.field) {
			t.Errorf("%s: %d %v, want 400 naming %s", c.body, st, body, c.field)
		}
	}
	if st, body := srcCall(t, ts, "GET", "/v1/sources/std", "", nil); st != 200 || strings.Contains(mustJSON(body), std[6:]) {
		t.Fatalf("GET std: %d %v (must not show the secret)", st, body)
	}
	if st, body := srcCall(t, ts, "GET", "/v1/sources/webhooks", "", nil); st != 200 || body["path"] != "/webhooks" {
		t.Fatalf("GET webhooks: %d %v", st, body)
	} else if settings := body["settings"].(map[string]any); settings["serve_flags"] != true || settings["signature"] != "standard-webhooks" {
		t.Fatalf("the default source's settings: %v", settings)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestDefaultsCreatedOnce: the default sources and the default webhooks
// subscription are created at the first start only: deleted, they stay
// deleted across a restart, and the webhooks already stored get no second
// item (they would from a re-created subscription starting at earliest).
func TestDefaultsCreatedOnce(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	_, list := srcCall(t, ts, "GET", "/v1/sources", "", nil)
	var kinds []string
	srcs, _ := list["sources"].([]any)
	for _, src := range srcs {
		src := src.(map[string]any)
		kinds = append(kinds, src["name"].(string)+":"+src["kind"].(string)+":"+mustJSON(src["checkpoint"]))
	}
	if strings.Join(kinds, " ") != "devices:device:{} webhooks:webhook:{}" {
		t.Fatalf("sources at the first start: %v", list)
	}
	for i := range 3 {
		if st, body := srcCall(t, ts, "POST", "/webhooks", `{"n": `+strconv.Itoa(i)+`}`, map[string]string{"Idempotency-Key": "once-" + strconv.Itoa(i)}); st != 202 {
			t.Fatalf("webhook %d: %d %v", i, st, body)
		}
	}
	items := func(ts *servertest.Server) int {
		var n int
		if err := ts.Store().ReadDB().QueryRow(`SELECT COUNT(*) FROM inbox_items WHERE inbox_id = 'webhooks'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, 10*time.Second, "3 items in webhooks", func() bool { return items(ts) == 3 })
	if st, body := srcCall(t, ts, "DELETE", "/v1/sources/webhooks", "", nil); st != 409 || !strings.Contains(errorMessage(body), "webhooks") {
		t.Fatalf("delete the source webhooks while its subscription reads it: %d %v, want 409 naming it", st, body)
	}
	if st, _ := srcCall(t, ts, "DELETE", "/v1/subscriptions/webhooks", "", nil); st != 204 {
		t.Fatalf("delete the default subscription: %d", st)
	}
	if st, _ := srcCall(t, ts, "DELETE", "/v1/sources/devices", "", nil); st != 204 {
		t.Fatalf("delete the source devices: %d", st)
	}
	ts.Stop()

	ts = servertest.Start(t, server.Config{DBPath: ts.DBPath}, nil)
	if st, body := srcCall(t, ts, "GET", "/v1/subscriptions/webhooks", "", nil); st != 404 {
		t.Fatalf("the deleted default subscription after a restart: %d %v, want 404", st, body)
	}
	if st, body := srcCall(t, ts, "GET", "/v1/sources/devices", "", nil); st != 404 {
		t.Fatalf("the deleted source devices after a restart: %d %v, want 404", st, body)
	}
	if st, _ := srcCall(t, ts, "POST", "/webhooks", `{"n": 9}`, map[string]string{"Idempotency-Key": "once-9"}); st != 202 {
		t.Fatalf("a webhook after the restart: %d", st)
	}
	if n := items(ts); n != 3 {
		t.Fatalf("items in webhooks after the restart: %d, want the 3 of before", n)
	}
	// The source webhooks itself, deleted, stays deleted too.
	if st, _ := srcCall(t, ts, "DELETE", "/v1/sources/webhooks", "", nil); st != 204 {
		t.Fatalf("delete the source webhooks: %d", st)
	}
	if st, body := srcCall(t, ts, "POST", "/webhooks", `{}`, map[string]string{"Idempotency-Key": "gone"}); st != 404 {
		t.Fatalf("POST /webhooks without its source: %d %v, want 404", st, body)
	}
	ts.Stop()
	ts = servertest.Start(t, server.Config{DBPath: ts.DBPath}, nil)
	_, list = srcCall(t, ts, "GET", "/v1/sources", "", nil)
	if srcs, _ := list["sources"].([]any); len(srcs) != 0 {
		t.Fatalf("sources after deleting both defaults and a restart: %v", list)
	}
	if n := items(ts); n != 3 {
		t.Fatalf("items in webhooks after the second restart: %d", n)
	}
	// An operator may create a default again.
	if st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "webhooks", "kind": "webhook", "settings": {"serve_flags": true}}`, nil); st != 201 {
		t.Fatalf("create webhooks again: %d %v", st, body)
	}
	if st, _ := srcCall(t, ts, "POST", "/webhooks", `{}`, map[string]string{"Idempotency-Key": "back"}); st != 202 {
		t.Fatalf("POST /webhooks once its source is back: %d", st)
	}
}
