package server

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// The webhook intake writes its JSON by appending (webhookMetadata,
// writeAccepted); these tests hold it to the bytes encoding/json writes
// of the same values.

// jsonStrings are strings that encoding/json writes escaped, or not.
var jsonStrings = []string{
	"", "plain", "wh_bench_1", "Tom & Jerry <shop>", "a&b", "a>b", `quote " and \ backslash`, "tab\there", "nl\n cr\r",
	"\x00\x01\x1f\x7f", "é ü 中文", "\u2028\u2029", "invalid \xff\xfe utf-8", "trunc \xe2\x82",
	"sha256=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd", "t=1492774577,v1=5257a8",
}

func FuzzAppendJSONLowerASCII(f *testing.F) {
	for _, s := range jsonStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lower, _ := json.Marshal(strings.ToLower(s))
		if isASCII(s) {
			if got := appendJSONLowerASCII(nil, s); string(got) != string(lower) {
				t.Fatalf("appendJSONLowerASCII(%q) = %s, want %s", s, got, lower)
			}
		}
	})
}

// metadataAsJSON is what webhookMetadata wrote through encoding/json: a
// map of the kept headers, marshalled.
func metadataAsJSON(r *http.Request, cfg WebhookConfig) []byte {
	headers := map[string]string{}
	for name, values := range r.Header {
		if keptHeader(name, cfg) {
			headers[strings.ToLower(name)] = strings.Join(values, ", ")
		}
	}
	meta, _ := json.Marshal(map[string]any{"headers": headers, "remote_addr": r.RemoteAddr})
	return meta
}

// TestWebhookMetadataBytes: webhookMetadata writes what encoding/json
// writes of its map, for header sets drawn at random from names kept and
// not kept (ASCII, non-ASCII, configured in another case) and values that
// need escaping.
func TestWebhookMetadataBytes(t *testing.T) {
	cfg := WebhookConfig{KeyHeader: "x-provider-id", TypeHeader: "X-PROVIDER-EVENT"}
	names := []string{"Content-Type", "User-Agent", "X-Event-Type", "Idempotency-Key", "Authorization", "Content-Length",
		"X-Provider-Id", "X-Provider-Event", "X-Github-Event", "Stripe-Signature", "Webhook-Id", "Webhook-Signature",
		"X-Gitlab-Event", "X-Gitlab-Event-Uuid", "X-Hub-Signature-256", "Accept-Encoding", "Cookie", "X-Forwarded-For",
		"Ce-Id", "Traceparent", "X-Github-Émoji", "X-Github-A&b", "X-Github-Header-Name-Beyond-Thirty-Two-Bytes",
		"X-Émoji", "X-A&b"}
	rng := rand.New(rand.NewPCG(1, 2))
	kept := 0
	for range 2000 {
		r := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
		r.Header = http.Header{}
		r.RemoteAddr = jsonStrings[rng.IntN(len(jsonStrings))]
		for range rng.IntN(8) {
			name := names[rng.IntN(len(names))]
			for range 1 + rng.IntN(2) {
				r.Header[name] = append(r.Header[name], jsonStrings[rng.IntN(len(jsonStrings))])
			}
		}
		got, err := webhookMetadata(r, cfg)
		if err != nil {
			t.Fatalf("headers %q: %v", r.Header, err)
		}
		if want := metadataAsJSON(r, cfg); string(got) != string(want) {
			t.Fatalf("headers %q, remote address %q:\n got %s\nwant %s", r.Header, r.RemoteAddr, got, want)
		}
		if strings.Contains(string(got), `"headers":{"`) {
			kept++
		}
	}
	if kept < 1000 {
		t.Fatalf("only %d of 2000 requests kept a header: the test does not test", kept)
	}
}

// TestWriteAcceptedBytes: the 202 of a new webhook is what writeJSON
// writes of its api.Webhook.
func TestWriteAcceptedBytes(t *testing.T) {
	times := []time.Time{
		time.Date(2026, 11, 24, 16, 17, 0, 123456789, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 120000000, time.FixedZone("", 5*3600+1800)),
		time.Date(1999, 12, 31, 23, 59, 59, 1, time.Local),
	}
	for i, key := range jsonStrings {
		created, offset, source := times[i%len(times)], int64(i)*1234567, []string{WebhookSource, "gh", "a_b.c-9"}[i%3]
		want := httptest.NewRecorder()
		writeJSON(want, http.StatusAccepted, api.Webhook{ID: webhookID(source, offset), IdempotencyKey: key, Status: delivery.StatePending, CreatedAt: created})
		got := httptest.NewRecorder()
		writeAccepted(got, source, offset, key, created)
		if got.Code != want.Code || got.Body.String() != want.Body.String() || got.Header().Get("Content-Type") != want.Header().Get("Content-Type") {
			t.Fatalf("key %q:\n got %d %q %s\nwant %d %q %s", key, got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
		}
	}
}

// TestWebhookID: an id names its source, but for the default source's,
// and parses back; what is not an id does not parse.
func TestWebhookID(t *testing.T) {
	for _, c := range []struct {
		source string
		offset int64
		id     string
	}{{WebhookSource, 42, "wh_42"}, {"gh", 7, "wh_gh_7"}, {"my_src.v2", 1, "wh_my_src.v2_1"}, {"42", 3, "wh_42_3"}} {
		if id := webhookID(c.source, c.offset); id != c.id {
			t.Errorf("webhookID(%q, %d) = %q, want %q", c.source, c.offset, id, c.id)
		}
		if source, offset, ok := parseWebhookID(c.id); !ok || source != c.source || offset != c.offset {
			t.Errorf("parseWebhookID(%q) = %q, %d, %v", c.id, source, offset, ok)
		}
	}
	for _, id := range []string{"", "42", "wh_", "wh_0", "wh_-1", "wh_gh", "wh_gh_", "wh__1", "wh_a b_1", "evt_1"} {
		if source, offset, ok := parseWebhookID(id); ok {
			t.Errorf("parseWebhookID(%q) = %q, %d, true; want not an id", id, source, offset)
		}
	}
}

// TestWebhookMetadataOneCase: two names of one lower case (a request made
// in Go, not read from the wire) keep one value, as a map did.
func TestWebhookMetadataOneCase(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
	r.Header = http.Header{"X-Github-Event": {"a"}, "x-github-event": {"b"}, "X-GITHUB-EVENT": {"c"}}
	r.RemoteAddr = "192.0.2.1:1234"
	got, err := webhookMetadata(r, WebhookConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "b", "c"} {
		if string(got) == `{"headers":{"x-github-event":"`+v+`"},"remote_addr":"192.0.2.1:1234"}` {
			return
		}
	}
	t.Fatalf("metadata %s: want one x-github-event", got)
}

// TestDecodeStrict: names are matched exactly and once, down through
// structs, maps and slices, but what decodes as raw JSON or any value (a
// payload) is not looked into.
func TestDecodeStrict(t *testing.T) {
	type body struct {
		Name string          `json:"name"`
		Data json.RawMessage `json:"data"`
		Any  any             `json:"any"`
		M    map[string]int  `json:"m"`
		L    []struct {
			X int `json:"x"`
		} `json:"l"`
	}
	for _, c := range []struct {
		in       string
		code     api.Code
		mentions string
	}{
		{`{"name":"a","data":{"k":1,"k":2},"any":{"K":1,"K":2},"m":{"a":1,"A":2},"l":[{"x":1}]}`, "", ""},
		{`{"l":[{"x":1},{"X":2}]}`, api.CodeUnknownField, `"l[].X" (names are case-sensitive: "x")`},
		{`{"m":{"a":1,"a":2}}`, api.CodeInvalidJSON, `"m.a" appears twice`},
		{`{"name":"a","Name":"b"}`, api.CodeUnknownField, `"Name"`},
		{`{"name":"a"} {}`, api.CodeInvalidJSON, "more than one"},
		{`{"name":1}`, api.CodeInvalidJSON, `field "name": want a string, got a JSON number`},
	} {
		var v body
		code, msg, ok := decodeStrict([]byte(c.in), &v)
		if ok != (c.code == "") || code != c.code || !strings.Contains(msg, c.mentions) {
			t.Errorf("%s: %v %s %q, want %q mentioning %q", c.in, ok, code, msg, c.code, c.mentions)
		}
	}
}
