package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// The webhook answer writes its JSON by appending (writeAccepted); these
// tests hold it to the bytes encoding/json writes of the same values
// (internal/intake's hold the metadata to them).

// jsonStrings are strings that encoding/json writes escaped, or not.
var jsonStrings = []string{
	"", "plain", "wh_bench_1", "Tom & Jerry <shop>", "a&b", "a>b", `quote " and \ backslash`, "tab\there", "nl\n cr\r",
	"\x00\x01\x1f\x7f", "é ü 中文", "\u2028\u2029", "invalid \xff\xfe utf-8", "trunc \xe2\x82",
	"sha256=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd", "t=1492774577,v1=5257a8",
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
