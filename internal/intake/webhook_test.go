package intake_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// now is the time every webhook of these tests is parsed at.
var now = time.Date(2026, 11, 29, 4, 30, 0, 0, time.UTC)

const (
	stdSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	githubSecret = "It's a Secret to Everybody"
	stripeSecret = "whsec_stripe_test"
)

// serve is serve's configuration in these tests: its flags give the
// default source a key header and Standard Webhooks keys.
func serve(t *testing.T) intake.ServeConfig {
	key, err := stdwebhook.ParseSecret(stdSecret)
	if err != nil {
		t.Fatal(err)
	}
	return intake.ServeConfig{MaxBytes: 1 << 20, MaxTypeBytes: 128, Identity: intake.Identity{KeyField: "id"}, Keys: [][]byte{key}}
}

// webhook is a request to POST /webhooks: its headers and body, and an
// error its body ends with instead of io.EOF.
type webhook struct {
	headers map[string]string
	body    string
	bodyErr error
}

func (w webhook) request() *http.Request {
	var body io.Reader = strings.NewReader(w.body)
	if w.bodyErr != nil {
		body = io.MultiReader(body, errReader{w.bodyErr})
	}
	r := httptest.NewRequest(http.MethodPost, "/webhooks", body)
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header.Set("Content-Type", "application/json")
	for k, v := range w.headers {
		if v == "" {
			r.Header.Del(k)
			continue
		}
		r.Header[http.CanonicalHeaderKey(k)] = strings.Split(v, "\x00") // NUL: a header given several times
	}
	return r
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// parse runs the intake of settings on w as the server does: Read, then
// Parse.
func parse(t *testing.T, settings intake.WebhookSettings, w webhook) (intake.Parsed, *intake.Refusal, intake.Webhook) {
	t.Helper()
	cfg := serve(t)
	if strings.HasPrefix(w.body, "!small:") {
		cfg.MaxBytes = 16
		w.body = strings.TrimPrefix(w.body, "!small:")
	}
	wh := settings.Webhook(cfg)
	r := w.request()
	body, ref := wh.Read(httptest.NewRecorder(), r)
	if ref != nil {
		return intake.Parsed{}, ref, wh
	}
	p, ref := wh.Parse(r, body, now)
	return p, ref, wh
}

// signed signs w's body with Standard Webhooks as message id at ts.
func signed(w webhook, id string, ts time.Time) webhook {
	key, _ := stdwebhook.ParseSecret(stdSecret)
	h := map[string]string{"webhook-id": id, "webhook-timestamp": itoa(ts.Unix()), "webhook-signature": stdwebhook.Sign(key, id, ts, []byte(w.body))}
	for k, v := range w.headers {
		h[k] = v
	}
	w.headers = h
	return w
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

var (
	github = intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{githubSecret}}
	stripe = intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{stripeSecret}}
	std    = intake.WebhookSettings{Secrets: []string{stdSecret}}
)

// TestParseWebhookRefusals: every way a webhook is refused before the
// store is asked, with its code (hence its status) and message. A
// message ending in "…" is the beginning of the one expected.
func TestParseWebhookRefusals(t *testing.T) {
	ghBody := `{"action":"opened"}`
	stripeBody := `{"id":"evt_1","type":"invoice.paid"}`
	deep := strings.Repeat("[", 1001) + strings.Repeat("]", 1001)
	for _, c := range []struct {
		name     string
		settings intake.WebhookSettings
		w        webhook
		code     api.Code
		msg      string
	}{
		// Read: media type and body.
		{"content type", intake.WebhookSettings{}, webhook{headers: map[string]string{"Content-Type": "text/plain"}, body: `{}`},
			api.CodeUnsupportedMediaType, `Content-Type "text/plain": send application/json`},
		{"no content type", intake.WebhookSettings{}, webhook{headers: map[string]string{"Content-Type": ""}, body: `{}`},
			api.CodeUnsupportedMediaType, `Content-Type "": send application/json`},
		{"too large", intake.WebhookSettings{}, webhook{body: `!small:{"a":"0123456789"}`}, api.CodeTooLarge, "the body is over 16 bytes"},
		{"ended early", intake.WebhookSettings{}, webhook{body: `{"a":`, bodyErr: io.ErrUnexpectedEOF},
			api.CodeInvalidJSON, "the body could not be read: it ended early"},
		{"read deadline", intake.WebhookSettings{}, webhook{body: `{"a":`, bodyErr: os.ErrDeadlineExceeded},
			api.CodeRequestTimeout, "the body did not arrive in time (--http-read-timeout)"},
		// The body.
		{"empty", intake.WebhookSettings{}, webhook{body: " \n"}, api.CodeInvalidJSON, "the body is empty: send the webhook's JSON"},
		{"bad JSON", intake.WebhookSettings{}, webhook{body: `{"a":1`}, api.CodeInvalidJSON, "the body is not valid JSON"},
		{"two values", intake.WebhookSettings{}, webhook{body: `{} {}`}, api.CodeInvalidJSON, "the body is not valid JSON"},
		{"not UTF-8", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: "{\"a\":\"\xff\"}"},
			api.CodeInvalidJSON, "the body is not valid UTF-8: send JSON text encoded as UTF-8"},
		{"too deep", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: deep},
			api.CodeInvalidField, "the body's …"},
		// The key.
		{"no key", intake.WebhookSettings{}, webhook{body: `{}`},
			api.CodeMissingField, "idempotency key: send an Idempotency-Key or webhook-id header"},
		{"blank key", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "  "}, body: `{}`},
			api.CodeMissingField, "idempotency key: send an Idempotency-Key or webhook-id header"},
		{"no key anywhere configured", intake.WebhookSettings{KeyHeader: "X-Delivery", KeyField: "id"}, webhook{body: `{"id":" "}`},
			api.CodeMissingField, `idempotency key: send an Idempotency-Key or webhook-id header, or a X-Delivery header, or a string or number field "id" in the body`},
		{"signed without webhook-id", intake.WebhookSettings{ServeFlags: true}, signed(webhook{body: `{}`}, " ", now),
			api.CodeMissingField, `idempotency key: send a webhook-id header, or a string or number field "id" in the body`},
		{"key control character", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "a\x01b"}, body: `{}`},
			api.CodeInvalidField, "Idempotency-Key header: holds the control character U+0001"},
		{"key too long", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, body: `{}`},
			api.CodeInvalidField, "Idempotency-Key header: 256 bytes, at most 255"},
		{"key not UTF-8", intake.WebhookSettings{}, webhook{headers: map[string]string{"Webhook-Id": "a\xffb"}, body: `{}`},
			api.CodeInvalidField, "Webhook-Id header: not valid UTF-8"},
		{"key U+FFFD", intake.WebhookSettings{KeyHeader: "X-Delivery"}, webhook{headers: map[string]string{"X-Delivery": "a\uFFFDb"}, body: `{}`},
			api.CodeInvalidField, "X-Delivery header: holds U+FFFD, which stands for invalid UTF-8"},
		{"key field an object", intake.WebhookSettings{KeyField: "id"}, webhook{body: `{"id":{"a":1}}`},
			api.CodeInvalidField, `field "id": want a string or a number, got a JSON object`},
		{"key field a boolean", intake.WebhookSettings{KeyField: "id"}, webhook{body: `{"id":true}`},
			api.CodeInvalidField, `field "id": want a string or a number, got a JSON boolean`},
		{"key field twice", intake.WebhookSettings{KeyField: "id"}, webhook{body: `{"id":"a","id":"b"}`},
			api.CodeInvalidField, `field "id": appears twice in the body; which one is the webhook's?`},
		{"key field too long", intake.WebhookSettings{KeyField: "id"}, webhook{body: `{"id":"` + strings.Repeat("k", 256) + `"}`},
			api.CodeInvalidField, `field "id": 256 bytes, at most 255`},
		// The type.
		{"type too long", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Event-Type": strings.Repeat("t", 129)}, body: `{}`},
			api.CodeInvalidField, "X-Event-Type header: 129 bytes, at most 128"},
		{"type control character", intake.WebhookSettings{TypeField: "kind"}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"kind":"a\u0007"}`},
			api.CodeInvalidField, `field "kind": holds the control character U+0007`},
		{"type field an array", intake.WebhookSettings{TypeField: "kind"}, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{"kind":[]}`},
			api.CodeInvalidField, `field "kind": want a string or a number, got a JSON array`},
		{"signed type field twice", intake.WebhookSettings{ServeFlags: true}, signed(webhook{body: `{"type":"a","type":"b"}`}, "msg_1", now),
			api.CodeInvalidField, `field "type": appears twice in the body; which one is the webhook's?`},
		// The headers kept as metadata.
		{"header too long", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k", "User-Agent": strings.Repeat("u", 2049)}, body: `{}`},
			api.CodeInvalidField, "header User-Agent: 2049 bytes, at most 2048"},
		{"header given twice too long", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Github-Event": strings.Repeat("e", 1024) + "\x00" + strings.Repeat("e", 1024)}, body: `{}`},
			api.CodeInvalidField, "header X-Github-Event: 2050 bytes, at most 2048"},
		{"headers too long", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": "k",
			"X-Github-A": strings.Repeat("a", 2000), "X-Github-B": strings.Repeat("b", 2000), "X-Github-C": strings.Repeat("c", 2000),
			"X-Github-D": strings.Repeat("d", 2000), "X-Github-E": strings.Repeat("e", 2000)}, body: `{}`},
			api.CodeInvalidField, "headers: the ones kept with a webhook (provider ids, events, signatures) exceed 8192 bytes"},
		// Signatures.
		{"standard: none", std, webhook{headers: map[string]string{"Idempotency-Key": "k"}, body: `{}`},
			api.CodeInvalidSignature, "Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): missing webhook-id, webhook-timestamp or webhook-signature"},
		{"standard: another body", std, func() webhook {
			w := signed(webhook{body: `{"type":"a"}`}, "msg_1", now)
			w.body = `{"type":"b"}`
			return w
		}(), api.CodeInvalidSignature, "Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): no signature matches"},
		{"standard: stale", std, signed(webhook{body: `{}`}, "msg_1", now.Add(-6*time.Minute)),
			api.CodeInvalidSignature, "Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): timestamp outside the tolerance: …"},
		{"standard: early", std, signed(webhook{body: `{}`}, "msg_1", now.Add(6*time.Minute)),
			api.CodeInvalidSignature, "Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): timestamp outside the tolerance: …"},
		{"serve flags: another secret", intake.WebhookSettings{ServeFlags: true}, func() webhook {
			key, _ := stdwebhook.ParseSecret("whsec_QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB")
			return webhook{headers: map[string]string{"webhook-id": "msg_1", "webhook-timestamp": itoa(now.Unix()),
				"webhook-signature": stdwebhook.Sign(key, "msg_1", now, []byte(`{}`))}, body: `{}`}
		}(), api.CodeInvalidSignature, "Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): no signature matches"},
		{"github: none", github, webhook{headers: map[string]string{"X-GitHub-Delivery": "d1", "X-GitHub-Event": "push"}, body: ghBody},
			api.CodeInvalidSignature, "X-Hub-Signature-256: missing signature"},
		{"github: malformed", github, webhook{headers: map[string]string{"X-GitHub-Delivery": "d1", "X-Hub-Signature-256": "sha1=00"}, body: ghBody},
			api.CodeInvalidSignature, "X-Hub-Signature-256: malformed signature: want sha256= and hex"},
		{"github: another secret", github, webhook{headers: map[string]string{"X-GitHub-Delivery": "d1",
			"X-Hub-Signature-256": webhooksig.SignGitHub("another", []byte(ghBody))}, body: ghBody},
			api.CodeInvalidSignature, "X-Hub-Signature-256: no signature matches"},
		{"github: no delivery id", github, webhook{headers: map[string]string{"Idempotency-Key": "k",
			"X-Hub-Signature-256": webhooksig.SignGitHub(githubSecret, []byte(ghBody))}, body: ghBody},
			api.CodeMissingField, "idempotency key: send a X-GitHub-Delivery header"},
		{"stripe: none", stripe, webhook{body: stripeBody}, api.CodeInvalidSignature, "Stripe-Signature: missing signature"},
		{"stripe: stale", stripe, webhook{headers: map[string]string{"Stripe-Signature": webhooksig.SignStripe(stripeSecret, now.Add(-time.Hour), []byte(stripeBody))}, body: stripeBody},
			api.CodeInvalidSignature, "Stripe-Signature: timestamp outside the tolerance…"},
		{"stripe: no id", stripe, webhook{headers: map[string]string{"Stripe-Signature": webhooksig.SignStripe(stripeSecret, now, []byte(`{"type":"x"}`))}, body: `{"type":"x"}`},
			api.CodeMissingField, `idempotency key: send a string or number field "id" in the body`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ref, _ := parse(t, c.settings, c.w)
			if ref == nil {
				t.Fatalf("taken as %q of type %q; want %s %q", p.Key, p.Type, c.code, c.msg)
			}
			if ref.Code != c.code || !matches(ref.Message, c.msg) {
				t.Fatalf("refused %s %q, want %s %q", ref.Code, ref.Message, c.code, c.msg)
			}
			if ref.Status() != c.code.Status() || ref.Status() < 400 {
				t.Fatalf("status %d", ref.Status())
			}
		})
	}
}

// matches reports whether got is want, or begins with want but its
// final "…".
func matches(got, want string) bool {
	if prefix, ok := strings.CutSuffix(want, "…"); ok {
		return strings.HasPrefix(got, prefix)
	}
	return got == want
}

// TestParseWebhookAccepted: where each kind of source takes a webhook's
// key and type from, and what its event holds.
func TestParseWebhookAccepted(t *testing.T) {
	ghBody := `{"action":"opened", "number": 1}`
	stripeBody := `{"id":"evt_1", "type":"invoice.paid"}`
	for _, c := range []struct {
		name      string
		settings  intake.WebhookSettings
		w         webhook
		key, typ  string
		headers   map[string]string // kept in the metadata
		notKept   []string          // not in the metadata
		replayFor time.Duration
	}{
		{"key and type headers", intake.WebhookSettings{}, webhook{headers: map[string]string{"Idempotency-Key": " k1 ", "X-Event-Type": "order.created",
			"Authorization": "Bearer secret", "User-Agent": "ua"}, body: `{"a": 1}`},
			"k1", "order.created", map[string]string{"idempotency-key": " k1 ", "x-event-type": "order.created", "user-agent": "ua", "content-type": "application/json"},
			[]string{"authorization"}, 0},
		{"webhook-id unsigned", intake.WebhookSettings{}, webhook{headers: map[string]string{"Webhook-Id": "msg_1"}, body: `[]`},
			"msg_1", "webhook", map[string]string{"webhook-id": "msg_1"}, nil, 0},
		{"Idempotency-Key before webhook-id", intake.WebhookSettings{}, webhook{headers: map[string]string{"Webhook-Id": "msg_1", "Idempotency-Key": "k"}, body: `1`},
			"k", "webhook", nil, nil, 0},
		{"configured headers", intake.WebhookSettings{KeyHeader: "X-Delivery", TypeHeader: "X-Kind"}, webhook{headers: map[string]string{"X-Delivery": "d1", "X-Kind": "push"}, body: `{}`},
			"d1", "push", map[string]string{"x-delivery": "d1", "x-kind": "push"}, nil, 0},
		{"body fields", intake.WebhookSettings{KeyField: "id", TypeField: "kind"}, webhook{body: `{"id": 42, "kind": "paid", "id2": 1}`},
			"42", "paid", nil, nil, 0},
		{"X-Event-Type before the type field", intake.WebhookSettings{TypeField: "kind"}, webhook{headers: map[string]string{"Idempotency-Key": "k", "X-Event-Type": "h"}, body: `{"kind":"f"}`},
			"k", "h", nil, nil, 0},
		{"signed: webhook-id and the body's type", std, signed(webhook{headers: map[string]string{"Idempotency-Key": "forged", "X-Event-Type": "forged"},
			body: `{"type":"invoice.paid"}`}, "msg_1", now),
			"msg_1", "invoice.paid", map[string]string{"webhook-id": "msg_1"}, nil, 0},
		{"signed: within the tolerance", std, signed(webhook{body: `{}`}, "msg_2", now.Add(-4*time.Minute)),
			"msg_2", "webhook", nil, nil, 0},
		{"signed: the body's key field", intake.WebhookSettings{ServeFlags: true}, signed(webhook{body: `{"id":"evt_9","type":"t"}`}, "msg_1", now),
			"evt_9", "t", nil, nil, 0},
		{"signed: CloudEvents headers are not read", std, signed(webhook{headers: map[string]string{"ce-specversion": "1.0", "ce-id": "x"}, body: `{"type":"t"}`}, "msg_1", now),
			"msg_1", "t", nil, nil, 0},
		{"github", github, webhook{headers: map[string]string{"X-GitHub-Delivery": "d1", "X-GitHub-Event": "pull_request", "Idempotency-Key": "forged", "X-Event-Type": "forged",
			"X-Hub-Signature-256": webhooksig.SignGitHub(githubSecret, []byte(ghBody))}, body: ghBody},
			"d1", "pull_request", map[string]string{"x-github-delivery": "d1", "x-github-event": "pull_request"}, nil, intake.DefaultReplayWindow},
		{"github, replay window 0", intake.WebhookSettings{Preset: intake.PresetGitHub, Secrets: []string{"old", githubSecret}, ReplayWindow: "0"},
			webhook{headers: map[string]string{"X-GitHub-Delivery": "d1", "X-GitHub-Event": "push",
				"X-Hub-Signature-256": webhooksig.SignGitHub(githubSecret, []byte(ghBody))}, body: ghBody},
			"d1", "push", nil, nil, 0},
		{"stripe", stripe, webhook{headers: map[string]string{"Stripe-Signature": webhooksig.SignStripe(stripeSecret, now, []byte(stripeBody)), "Idempotency-Key": "forged"}, body: stripeBody},
			"evt_1", "invoice.paid", map[string]string{"stripe-signature": webhooksig.SignStripe(stripeSecret, now, []byte(stripeBody))}, nil, 0},
		{"stripe with its own key header", intake.WebhookSettings{Preset: intake.PresetStripe, Secrets: []string{stripeSecret}, KeyHeader: "X-Key"},
			webhook{headers: map[string]string{"Stripe-Signature": webhooksig.SignStripe(stripeSecret, now, []byte(stripeBody)), "X-Key": "hk"}, body: stripeBody},
			"hk", "invoice.paid", nil, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, ref, wh := parse(t, c.settings, c.w)
			if ref != nil {
				t.Fatalf("refused %s %q", ref.Code, ref.Message)
			}
			ev := p.Event()
			if p.Key != c.key || p.Type != c.typ || ev.NativeID != c.key || ev.Type != c.typ {
				t.Fatalf("key %q type %q (event %q %q), want %q %q", p.Key, p.Type, ev.NativeID, ev.Type, c.key, c.typ)
			}
			if string(ev.Payload) != c.w.body || !ev.OccurredAt.Equal(now) || p.CloudEvent != nil {
				t.Fatalf("payload %q at %v, CloudEvent %v; want the body as sent at %v", ev.Payload, ev.OccurredAt, p.CloudEvent, now)
			}
			if wh.ReplayWindow != c.replayFor {
				t.Fatalf("replay window %v, want %v", wh.ReplayWindow, c.replayFor)
			}
			var meta struct {
				Headers    map[string]string `json:"headers"`
				RemoteAddr string            `json:"remote_addr"`
			}
			if err := json.Unmarshal(ev.Metadata, &meta); err != nil || meta.RemoteAddr != "192.0.2.1:1234" {
				t.Fatalf("metadata %s: %v", ev.Metadata, err)
			}
			for k, v := range c.headers {
				if meta.Headers[k] != v {
					t.Errorf("metadata header %s = %q, want %q (%s)", k, meta.Headers[k], v, ev.Metadata)
				}
			}
			for _, k := range c.notKept {
				if _, ok := meta.Headers[k]; ok {
					t.Errorf("metadata keeps %s: %s", k, ev.Metadata)
				}
			}
		})
	}
}

// TestParseWebhookTraceContext: a valid trace context is kept in the
// event's metadata, an invalid one ignored (and an invalid tracestate
// alone dropped).
func TestParseWebhookTraceContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name                    string
		headers                 map[string]string
		traceparent, tracestate string
	}{
		{"valid", map[string]string{"traceparent": tp, "tracestate": "vendor=1"}, tp, "vendor=1"},
		{"invalid traceparent", map[string]string{"traceparent": "00-zz-00-01", "tracestate": "vendor=1"}, "", ""},
		{"invalid tracestate", map[string]string{"traceparent": tp, "tracestate": "vendor=é"}, tp, ""},
		{"none", nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := map[string]string{"Idempotency-Key": "k"}
			for k, v := range c.headers {
				h[k] = v
			}
			p, ref, _ := parse(t, intake.WebhookSettings{}, webhook{headers: h, body: `{}`})
			if ref != nil {
				t.Fatalf("refused %s %q", ref.Code, ref.Message)
			}
			if p.Traceparent != c.traceparent || p.Tracestate != c.tracestate {
				t.Fatalf("trace context %q %q, want %q %q", p.Traceparent, p.Tracestate, c.traceparent, c.tracestate)
			}
			var meta map[string]any
			if err := json.Unmarshal(p.Event().Metadata, &meta); err != nil {
				t.Fatal(err)
			}
			if got, _ := meta["traceparent"].(string); got != c.traceparent {
				t.Fatalf("metadata traceparent %q, want %q", got, c.traceparent)
			}
			if got, _ := meta["tracestate"].(string); got != c.tracestate {
				t.Fatalf("metadata tracestate %q, want %q", got, c.tracestate)
			}
		})
	}
}
