package api_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/poll"
)

// jsonFields returns the JSON names of t's fields, sorted.
func jsonFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "-" && f.IsExported() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// TestSettingsFieldsMatch: each kind's settings in the API and where the
// server reads them have the same JSON fields, so a setting added to one
// and not the other fails here (set or not in a test's values).
func TestSettingsFieldsMatch(t *testing.T) {
	for _, c := range []struct{ api, server any }{
		{api.PollSourceSettings{}, poll.Settings{}},
		{api.FeedSourceSettings{}, feed.Settings{}},
		{api.CreateWebhookSettings{}, intake.WebhookSettings{}},
	} {
		a, s := jsonFields(reflect.TypeOf(c.api)), jsonFields(reflect.TypeOf(c.server))
		if !slices.Equal(a, s) {
			t.Errorf("%T has the fields %v, %T %v", c.api, a, c.server, s)
		}
	}
}

// sameJSON encodes from, decodes it into to refusing unknown fields, and
// wants to encode to the same JSON: the two types carry the same fields.
func sameJSON(t *testing.T, name string, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(to); err != nil {
		t.Fatalf("%s: %s does not decode into %T: %v", name, b, to, err)
	}
	back, err := json.Marshal(to)
	if err != nil || !bytes.Equal(back, b) {
		t.Fatalf("%s: %T encodes %s, want %s (%v)", name, to, back, b, err)
	}
}

// TestUpstreamSourceSettings: the API's poll and feed settings carry
// every field the server's runners read, and no other.
func TestUpstreamSourceSettings(t *testing.T) {
	items := "/events"
	p := poll.Settings{URL: "https://api.example.com/events", Items: &items, ID: "/id", Type: "/type", Time: "/at",
		CursorParam: "after", Next: "/next", Interval: "5s", Headers: map[string]string{"Authorization": "env:TOKEN"}, Redirects: "none"}
	sameJSON(t, "poll, the server's into the API's", p, &api.PollSourceSettings{})
	a := api.PollSourceSettings{URL: p.URL, Items: &items, ID: p.ID, Type: p.Type, Time: p.Time, CursorParam: p.CursorParam,
		Next: p.Next, Interval: p.Interval, Headers: p.Headers, Redirects: p.Redirects}
	sameJSON(t, "poll, the API's into the server's", a, &poll.Settings{})

	f := feed.Settings{URL: "http://edge:8000/v1/streams/devices", Token: "env:EDGE", Redirects: "none"}
	sameJSON(t, "feed, the server's into the API's", f, &api.FeedSourceSettings{})
	sameJSON(t, "feed, the API's into the server's", api.FeedSourceSettings{URL: f.URL, Token: f.Token, Redirects: f.Redirects}, &feed.Settings{})
}

// TestSourceSettings: a source's settings decode as its kind's, none as
// the zero ones, and not as another kind's.
func TestSourceSettings(t *testing.T) {
	src := api.Source{Name: "gh", Kind: api.SourcePoll, Settings: json.RawMessage(`{"url":"https://x/","items":"","id":"/id","type":"/t"}`)}
	ps, err := src.PollSettings()
	if err != nil || ps.URL != "https://x/" || ps.Items == nil || *ps.Items != "" || ps.ID != "/id" || ps.Type != "/t" {
		t.Fatalf("poll settings: %+v %v", ps, err)
	}
	if _, err := src.WebhookSettings(); err == nil {
		t.Fatal("a poll source's settings decoded as a webhook source's")
	}
	if fs, err := (api.Source{Name: "m", Kind: api.SourceFeed}).FeedSettings(); err != nil || fs != (api.FeedSourceSettings{}) {
		t.Fatalf("no feed settings: %+v %v", fs, err)
	}
	ws, err := api.Source{Name: "w", Kind: api.SourceWebhook, Settings: json.RawMessage(`{"secrets":[{"fingerprint":"hmac:1"}],"signature":"standard-webhooks"}`)}.WebhookSettings()
	if err != nil || len(ws.Secrets) != 1 || ws.Secrets[0].Fingerprint != "hmac:1" || ws.Signature != "standard-webhooks" {
		t.Fatalf("webhook settings: %+v %v", ws, err)
	}
	if _, err := (api.Source{Name: "w", Kind: api.SourceWebhook, Settings: json.RawMessage(`{"secrets":"x"}`)}).WebhookSettings(); err == nil {
		t.Fatal("settings that are not a webhook source's decoded")
	}
}
