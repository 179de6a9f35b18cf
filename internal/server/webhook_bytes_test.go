package server_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streampg"
)

// The signing secrets of the providers in these tests.
const (
	githubSecret = "It's a Secret to Everybody"
	stripeSecret = "whsec_test_5WbX5kEWLlfzsGNjH64I8lOOqUB6e8FH"
)

// githubSignature is the X-Hub-Signature-256 GitHub sends: "sha256=" and
// the hex HMAC-SHA256 of the body under the webhook's secret.
func githubSignature(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// verifyGitHub checks X-Hub-Signature-256 as GitHub's documentation says
// a receiver must: the HMAC-SHA256 of the exact bytes received, compared
// in constant time.
func verifyGitHub(secret, header string, body []byte) error {
	sig, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return fmt.Errorf("X-Hub-Signature-256 %q: want sha256=<hex>", header)
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return fmt.Errorf("X-Hub-Signature-256: %v", err)
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	if !hmac.Equal(got, m.Sum(nil)) {
		return errors.New("X-Hub-Signature-256 does not match the body")
	}
	return nil
}

// stripeSignature is the Stripe-Signature Stripe sends at t: the
// timestamp and the hex HMAC-SHA256 of "<t>.<body>" (scheme v1).
func stripeSignature(secret string, t time.Time, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "%d.", t.Unix())
	m.Write(body)
	return fmt.Sprintf("t=%d,v1=%s", t.Unix(), hex.EncodeToString(m.Sum(nil)))
}

// verifyStripe checks Stripe-Signature as Stripe documents it: split the
// header on "," into key=value pairs, take t and every v1 (ignoring other
// schemes), compute the HMAC-SHA256 of "<t>.<exact body>", accept when
// one v1 equals it (constant time) and t is within 5 minutes of now.
func verifyStripe(secret, header string, body []byte, now time.Time) error {
	var ts string
	var sigs [][]byte
	for pair := range strings.SplitSeq(header, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return fmt.Errorf("Stripe-Signature %q: %q is not key=value", header, pair)
		}
		switch k {
		case "t":
			ts = v
		case "v1":
			if s, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, s)
			}
		}
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return fmt.Errorf("Stripe-Signature %q: no timestamp or no v1 signature", header)
	}
	if d := now.Sub(time.Unix(unix, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("Stripe-Signature: timestamp %s off", d)
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	want := m.Sum(nil)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return errors.New("Stripe-Signature: no v1 signature matches the body")
}

// received is one request a verifying target got.
type received struct {
	key  string // its Idempotency-Key
	body []byte
	err  error // what its provider's verification said
}

// verifyingTarget verifies each request with the verifier of the provider
// whose signature header it carries, answers 204 when it holds and 400
// when not, and records every request.
type verifyingTarget struct {
	*httptest.Server
	mu  sync.Mutex
	got []received
}

func newVerifyingTarget(t *testing.T) *verifyingTarget {
	v := &verifyingTarget{}
	v.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			switch {
			case r.Header.Get("X-Hub-Signature-256") != "":
				err = verifyGitHub(githubSecret, r.Header.Get("X-Hub-Signature-256"), body)
			case r.Header.Get("Stripe-Signature") != "":
				err = verifyStripe(stripeSecret, r.Header.Get("Stripe-Signature"), body, time.Now())
			default:
				err = errors.New("no signature header")
			}
		}
		v.mu.Lock()
		v.got = append(v.got, received{key: r.Header.Get("Idempotency-Key"), body: body, err: err})
		v.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(v.Close)
	return v
}

// reset forgets the requests so far.
func (v *verifyingTarget) reset() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.got = nil
}

// requests returns what the target got, by idempotency key.
func (v *verifyingTarget) requests() map[string][]received {
	v.mu.Lock()
	defer v.mu.Unlock()
	byKey := map[string][]received{}
	for _, r := range v.got {
		byKey[r.key] = append(byKey[r.key], r)
	}
	return byKey
}

// signedWebhook is a provider's delivery: its body and headers.
type signedWebhook struct {
	name, key string
	body      []byte
	headers   map[string]string
}

// githubWebhook is a delivery signed the GitHub way.
func githubWebhook(name, delivery, body string) signedWebhook {
	return signedWebhook{name: name, key: delivery, body: []byte(body), headers: map[string]string{
		"X-GitHub-Delivery": delivery, "X-GitHub-Event": "pull_request", "X-GitHub-Hook-ID": "292430182",
		"X-Hub-Signature-256": githubSignature(githubSecret, []byte(body)),
		"User-Agent":          "GitHub-Hookshot/044aadd",
	}}
}

// stripeWebhook is a delivery signed the Stripe way, its key the body's id.
func stripeWebhook(name, id, body string) signedWebhook {
	return signedWebhook{name: name, key: id, body: []byte(body), headers: map[string]string{
		"Stripe-Signature": stripeSignature(stripeSecret, time.Now(), []byte(body)),
		"User-Agent":       "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
	}}
}

// The bodies hold what re-encoding JSON would change: indentation and a
// final newline, key order, <, > and & (which encoding/json escapes),
// \u escapes and literal non-ASCII, U+2028, and numbers written as 1.50
// and 1e3.
const (
	githubPretty = "{\n  \"action\": \"opened\",\n  \"number\": 1347,\n  \"pull_request\": {\n    \"title\": \"Fix <script> & caf\\u00e9 — \u2028 ok\",\n" +
		"    \"additions\": 1.50,\n    \"deletions\": 1e3,\n    \"draft\": false,\n    \"labels\": [ ]\n  },\n  \"sender\": {\"login\": \"octocat\"}\n}\n"
	githubCompact = `{"zen":"Keep it logically awesome.","hook_id":292430182,"action":"closed","number":1348,"note":"a<b&c>d"}`
	stripePretty  = "{\n  \"id\": \"evt_1NG8Du2eZvKYlo2CUI79vXWy\",\n  \"object\": \"event\",\n  \"api_version\": \"2023-10-16\",\n" +
		"  \"created\": 1686089970,\n  \"data\": {\n    \"object\": {\n      \"id\": \"ch_3NG8Du2eZvKYlo2C0ysEm1Op\",\n" +
		"      \"amount\": 2000,\n      \"description\": \"Tom & Jerry <shop> \u00e9\",\n      \"metadata\": {}\n    }\n  },\n" +
		"  \"livemode\": false,\n  \"type\": \"charge.succeeded\"\n}"
	stripeCompact = `{"id":"evt_2","object":"event","type":"charge.refunded","data":{"object":{"amount":100.0,"currency":"eur"}}}`
)

// providerConfig takes the key and type from where GitHub and Stripe put
// them, and sends every webhook to target.
func providerConfig(target string) server.Config {
	return server.Config{
		Webhooks: server.WebhookConfig{KeyHeader: "X-GitHub-Delivery", TypeHeader: "X-GitHub-Event", KeyField: "id", TypeField: "type", Target: target},
		Delivery: fastRetries,
	}
}

// eachStreamBackend runs test on a server of each kind of stream backend:
// SQLite with its own writer; a backend behind the server's append queue;
// JetStream; and PostgreSQL (streams and delivery state), which needs
// POSTBOX_TEST_POSTGRES.
func eachStreamBackend(t *testing.T, cfg server.Config, test func(t *testing.T, ts *testServer)) {
	t.Run("sqlite", func(t *testing.T) { test(t, start(t, cfg, nil)) })
	t.Run("queue", func(t *testing.T) {
		ts, _ := startPlain(t, cfg)
		test(t, ts)
	})
	t.Run("nats", func(t *testing.T) { test(t, startNATS(t, natstest.Start(t), "BYTES_", cfg)) })
	t.Run("postgres", func(t *testing.T) {
		u := testenv.PostgresSchema(t)
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		schema := pu.Query().Get("search_path")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		streams, err := streampg.Open(ctx, streampg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		store, err := deliverypg.Open(ctx, deliverypg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		c := cfg
		c.Streams, c.Store = streams, store // the server closes them
		test(t, start(t, c, nil))
	})
}

// TestWebhookBytesInBytesOut: pretty-printed and compact webhooks signed
// the GitHub way and the Stripe way are stored byte for byte as received
// and reach the target with those bytes, where each provider's
// verification holds.
func TestWebhookBytesInBytesOut(t *testing.T) {
	tg := newVerifyingTarget(t)
	eachStreamBackend(t, providerConfig(tg.URL+"/hooks"), func(t *testing.T, ts *testServer) {
		tg.reset() // what the previous server delivered
		hooks := []signedWebhook{
			githubWebhook("GitHub pretty", "gh-1", githubPretty),
			githubWebhook("GitHub compact", "gh-2", githubCompact),
			stripeWebhook("Stripe pretty", "evt_1NG8Du2eZvKYlo2CUI79vXWy", stripePretty),
			stripeWebhook("Stripe compact", "evt_2", stripeCompact),
		}
		for _, h := range hooks {
			if status, body, _ := post(t, ts, string(h.body), h.headers); status != http.StatusAccepted {
				t.Fatalf("%s: %d %v", h.name, status, body)
			}
		}
		var got map[string][]received
		waitFor(t, 10*time.Second, "every webhook at the target", func() bool {
			got = tg.requests()
			for _, h := range hooks {
				if len(got[h.key]) == 0 {
					return false
				}
			}
			return true
		})
		ctx := context.Background()
		for _, h := range hooks {
			r := got[h.key][0]
			if r.err != nil {
				t.Errorf("%s: the target's verification failed: %v", h.name, r.err)
			}
			if !bytes.Equal(r.body, h.body) {
				t.Errorf("%s: the target got\n%q\nwant the bytes sent\n%q", h.name, r.body, h.body)
			}
			ev, err := ts.Srv.Streams().Lookup(ctx, server.WebhookSource, h.key, "")
			if err != nil || !bytes.Equal(ev.Payload, h.body) {
				t.Errorf("%s: stored payload %q (%v), want the request body %q", h.name, ev.Payload, err, h.body)
			}
		}
	})
}

// reindent returns body with other whitespace: compact, or indented with
// tabs.
func reindent(t *testing.T, body []byte, indent string) []byte {
	t.Helper()
	var b bytes.Buffer
	var err error
	if indent == "" {
		err = json.Compact(&b, body)
	} else {
		err = json.Indent(&b, body, "", indent)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestWebhookRedeliveryWhitespace: a webhook sent again with other
// whitespace is the duplicate it is (200, the original id and time, no
// second event, no second item), also when the copies arrive at once,
// while another value under its key is a conflict; the stored body stays
// the first one's bytes.
func TestWebhookRedeliveryWhitespace(t *testing.T) {
	eachStreamBackend(t, providerConfig(""), func(t *testing.T, ts *testServer) {
		hooks := []signedWebhook{
			githubWebhook("GitHub pretty", "gh-1", githubPretty),
			stripeWebhook("Stripe compact", "evt_2", stripeCompact),
		}
		first := map[string]map[string]any{}
		for _, h := range hooks {
			status, body, _ := post(t, ts, string(h.body), h.headers)
			if status != http.StatusAccepted {
				t.Fatalf("%s: %d %v", h.name, status, body)
			}
			first[h.key] = body
		}
		redeliveries := []signedWebhook{
			githubWebhook("GitHub pretty, again", "gh-1", githubPretty),
			githubWebhook("GitHub pretty, sent compact", "gh-1", string(reindent(t, []byte(githubPretty), ""))),
			githubWebhook("GitHub pretty, sent with tabs", "gh-1", string(reindent(t, []byte(githubPretty), "\t"))),
			stripeWebhook("Stripe compact, sent pretty", "evt_2", string(reindent(t, []byte(stripeCompact), "  "))),
			stripeWebhook("Stripe compact, with a final newline", "evt_2", stripeCompact+"\r\n"),
		}
		for _, h := range redeliveries {
			status, body, _ := post(t, ts, string(h.body), h.headers)
			want := first[h.key]
			if status != http.StatusOK || body["id"] != want["id"] || body["created_at"] != want["created_at"] || body["idempotency_key"] != h.key {
				t.Errorf("%s: %d %v, want 200 with id %v created at %v", h.name, status, body, want["id"], want["created_at"])
			}
		}
		conflicts := []signedWebhook{
			githubWebhook("GitHub, another number", "gh-1", strings.Replace(githubPretty, "1347", "1349", 1)),
			githubWebhook("GitHub, whitespace inside a string", "gh-1", strings.Replace(githubPretty, `"opened"`, `"opened "`, 1)),
			stripeWebhook("Stripe, another amount", "evt_2", strings.Replace(stripeCompact, "100.0", "100", 1)),
		}
		for _, h := range conflicts {
			if status, body, _ := post(t, ts, string(h.body), h.headers); status != http.StatusConflict || errorCode(body) != "conflict" ||
				!strings.Contains(fmt.Sprint(body), "different payload") {
				t.Errorf("%s: %d %v, want 409 conflict naming the payload", h.name, status, body)
			}
		}
		// Sent at once in several layouts, it is stored once; the others
		// are its duplicates, whichever commit they fall in.
		layouts := []string{githubCompact, string(reindent(t, []byte(githubCompact), "  ")), string(reindent(t, []byte(githubCompact), "\t")), githubCompact + "\n"}
		var wg sync.WaitGroup
		answers := make([]map[string]any, 12)
		statuses := make([]int, len(answers))
		for i := range answers {
			wg.Go(func() {
				h := githubWebhook("at once", "gh-2", layouts[i%len(layouts)])
				statuses[i], answers[i], _ = post(t, ts, string(h.body), h.headers)
			})
		}
		wg.Wait()
		stored := 0
		for i, a := range answers {
			if statuses[i] == http.StatusAccepted {
				stored++
			} else if statuses[i] != http.StatusOK {
				t.Errorf("sent at once: %d %v", statuses[i], a)
			}
			if a["id"] != answers[0]["id"] {
				t.Errorf("sent at once: ids %v and %v", a["id"], answers[0]["id"])
			}
		}
		if stored != 1 {
			t.Errorf("sent at once: %d answers 202, want 1", stored)
		}
		if _, st := call(t, ts, "GET", "/v1/streams/webhooks", ""); st["events"] != 3.0 {
			t.Errorf("the webhooks stream holds %v events, want 3", st["events"])
		}
		waitFor(t, 10*time.Second, "the 3 webhooks in the inbox", func() bool {
			_, body := call(t, ts, "GET", "/v1/inboxes/webhooks/items?state=pending", "")
			items, _ := body["items"].([]any)
			return len(items) == 3
		})
		m := ts.metrics(t)
		for result, want := range map[string]float64{"stored": 3, "duplicate": float64(len(redeliveries) + len(answers) - 1), "conflict": float64(len(conflicts))} {
			if got := m[`postbox_ingress_events_total{result="`+result+`",source="webhooks"}`]; got != want {
				t.Errorf("webhooks %s counted %v, want %v", result, got, want)
			}
		}
		for _, h := range hooks {
			ev, err := ts.Srv.Streams().Lookup(context.Background(), server.WebhookSource, h.key, "")
			if err != nil || !bytes.Equal(ev.Payload, h.body) {
				t.Errorf("%s: stored payload %q (%v), want the first delivery's bytes %q", h.name, ev.Payload, err, h.body)
			}
		}
	})
}
