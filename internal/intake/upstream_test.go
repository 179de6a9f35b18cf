package intake_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/netpolicy"
)

// TestUpstreamSettings: poll and feed settings are checked, naming the
// field; a missing one is ErrRequired; the URL goes through the address
// policy; what is stored is the settings as decoded.
func TestUpstreamSettings(t *testing.T) {
	decode := func(raw []byte, v any) error {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}
	check := netpolicy.Policy{}.CheckURL
	for _, c := range []struct {
		kind, settings string
		want           string // the stored settings, or what the error says
		required       bool
	}{
		{intake.KindPoll, ``, "settings: required: the upstream to read", true},
		{intake.KindPoll, `{"url": "http://x/e", "id": "/id", "type": "/t"}`, "settings.items: required", true},
		{intake.KindFeed, `{}`, "settings.url: required", true},
		{intake.KindPoll, `{"url": "http://x/e", "items": "/e", "id": "/id", "type": "/t", "bogus": 1}`, `unknown field "bogus"`, false},
		{intake.KindFeed, `{"url": "http://x:8000/v1/streams/.."}`, "the stream's name: use 1 to 128", false},
		{intake.KindFeed, `{"url": "http://169.254.169.254/v1/streams/devices"}`, "settings.url \"http://169.254.169.254/v1/streams/devices\": target address 169.254.169.254 is link-local", false},
		{intake.KindDevice, `{}`, `kind "device" reads nothing upstream`, false},
		{intake.KindPoll, `{"url": "http://x/e", "items": "", "id": "/id",  "type": "/t"}`, `{"url":"http://x/e","items":"","id":"/id","type":"/t"}`, false},
		{intake.KindFeed, `{"url": "http://x:8000/v1/streams/devices", "token": "env:T"}`, `{"url":"http://x:8000/v1/streams/devices","token":"env:T"}`, false},
	} {
		got, err := intake.UpstreamSettings(c.kind, json.RawMessage(c.settings), decode, check)
		switch {
		case err == nil && string(got) != c.want:
			t.Errorf("%s %s: stored %s, want %s", c.kind, c.settings, got, c.want)
		case err != nil && !strings.Contains(err.Error(), c.want):
			t.Errorf("%s %s: %v, want %q", c.kind, c.settings, err, c.want)
		case errors.Is(err, intake.ErrRequired) != c.required:
			t.Errorf("%s %s: %v: ErrRequired is %v, want %v", c.kind, c.settings, err, !c.required, c.required)
		}
	}
}

// TestUpstreamSettingsJSON: a poll source's header values and a feed
// source's token are shown as fingerprints, unless they name an
// environment variable.
func TestUpstreamSettingsJSON(t *testing.T) {
	fp := func(s string) string { return "fp(" + s + ")" }
	for _, c := range []struct {
		src  intake.Source
		want string
	}{
		{intake.Source{Kind: intake.KindPoll, Settings: json.RawMessage(`{"url":"http://x/e","items":"/e","id":"/id","type":"/t","headers":{"A":"env:TOKEN","B":"s3cret"}}`)},
			`{"url":"http://x/e","items":"/e","id":"/id","type":"/t","headers":{"A":"env:TOKEN","B":"fp(s3cret)"}}`},
		{intake.Source{Kind: intake.KindFeed, Settings: json.RawMessage(`{"url":"http://x/v1/streams/d","token":"t0k"}`)},
			`{"url":"http://x/v1/streams/d","token":"fp(t0k)"}`},
		{intake.Source{Kind: intake.KindFeed, Settings: json.RawMessage(`{"url":"http://x/v1/streams/d","token":"env:T"}`)},
			`{"url":"http://x/v1/streams/d","token":"env:T"}`},
		{intake.Source{Kind: intake.KindPoll, Settings: json.RawMessage(`{"url":"http://x/e","items":"/e","id":"/id","type":"/t","handle":{"url":"/r"},"reply":{"headers":{"A":"env:T","B":"b"},"signing_secret":"whsec_x"}}`)},
			`{"url":"http://x/e","items":"/e","id":"/id","type":"/t","handle":{"url":"/r"},"reply":{"headers":{"A":"env:T","B":"fp(b)"},"signing_secret":"fp(whsec_x)"}}`},
		{intake.Source{Kind: intake.KindFeed, Settings: json.RawMessage(`{"url":"http://x/v1/streams/d","reply":{"headers":{"B":"b"}}}`)},
			`{"url":"http://x/v1/streams/d","reply":{"headers":{"B":"fp(b)"}}}`},
		{intake.Source{Kind: intake.KindWebhook, Settings: json.RawMessage(`{"secrets":["x"]}`)}, `{}`},
	} {
		if got := intake.UpstreamSettingsJSON(c.src, fp); string(got) != c.want {
			t.Errorf("%s %s: %s, want %s", c.src.Kind, c.src.Settings, got, c.want)
		}
	}
}
