package intake

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The intake writes a webhook's metadata by appending (webhookMetadata);
// these tests hold it to the bytes encoding/json writes of the same
// values.

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
func metadataAsJSON(r *http.Request, id *Identity) []byte {
	headers := map[string]string{}
	for name, values := range r.Header {
		if keptHeader(name, id) {
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
	id := &Identity{KeyHeader: "x-provider-id", TypeHeader: "X-PROVIDER-EVENT"}
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
		got, err := webhookMetadata(r, id)
		if err != nil {
			t.Fatalf("headers %q: %v", r.Header, err)
		}
		if want := metadataAsJSON(r, id); string(got) != string(want) {
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

// TestWebhookMetadataOneCase: two names of one lower case (a request made
// in Go, not read from the wire) keep one value, as a map did.
func TestWebhookMetadataOneCase(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
	r.Header = http.Header{"X-Github-Event": {"a"}, "x-github-event": {"b"}, "X-GITHUB-EVENT": {"c"}}
	r.RemoteAddr = "192.0.2.1:1234"
	got, err := webhookMetadata(r, &Identity{})
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
