package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
)

// TestAPISourceSettings: sources created with package api's typed
// settings of each kind are shown with them, secrets as fingerprints.
func TestAPISourceSettings(t *testing.T) {
	_, c := apiServer(t, "")
	ctx := context.Background()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"events": []}`))
	}))
	defer upstream.Close()
	settings := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	items := "/events"
	poll := api.PollSourceSettings{URL: upstream.URL + "/events", Items: &items, ID: "/id", Type: "/type", Interval: "1h",
		Headers: map[string]string{"Authorization": "env:NO_SUCH_TOKEN", "X-Team": "billing"}}
	src, created, err := c.CreateSource(ctx, api.CreateSource{Name: "api", Kind: api.SourcePoll, Settings: settings(poll)})
	if err != nil || !created || src.Kind != api.SourcePoll {
		t.Fatalf("create a poll source: %+v %v %v", src, created, err)
	}
	got, err := src.PollSettings()
	if err != nil || got.URL != poll.URL || got.Items == nil || *got.Items != items || got.ID != "/id" || got.Type != "/type" || got.Interval != "1h" ||
		got.Headers["Authorization"] != "env:NO_SUCH_TOKEN" || got.Headers["X-Team"] == "billing" || got.Headers["X-Team"] == "" {
		t.Fatalf("the poll source's settings: %+v %v; want them back, X-Team as a fingerprint", got, err)
	}

	feed := api.FeedSourceSettings{URL: upstream.URL + "/v1/streams/devices", Token: "t0ken", Redirects: "none"}
	if _, _, err := c.CreateSource(ctx, api.CreateSource{Name: "mirror", Kind: api.SourceFeed, Settings: settings(feed)}); err != nil {
		t.Fatalf("create a feed source: %v", err)
	}
	src, err = c.Source(ctx, "mirror")
	if err != nil {
		t.Fatal(err)
	}
	if fs, err := src.FeedSettings(); err != nil || fs.URL != feed.URL || fs.Redirects != "none" || fs.Token == "" || fs.Token == feed.Token {
		t.Fatalf("the feed source's settings: %+v %v; want them back, the token as a fingerprint", fs, err)
	}

	hook := api.CreateWebhookSettings{Preset: "github", Secrets: []string{"gh-secret"}, ReplayWindow: "1h"}
	if _, _, err := c.CreateSource(ctx, api.CreateSource{Name: "gh", Kind: api.SourceWebhook, Settings: settings(hook)}); err != nil {
		t.Fatalf("create a webhook source: %v", err)
	}
	if _, created, err := c.CreateSource(ctx, api.CreateSource{Name: "gh", Kind: api.SourceWebhook, Settings: settings(hook)}); err != nil || created {
		t.Fatalf("create it again: %v %v, want it to exist", created, err)
	}
	all, err := c.Sources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gh api.Source
	for _, s := range all {
		if s.Name == "gh" {
			gh = s
		}
	}
	ws, err := gh.WebhookSettings()
	if err != nil || gh.Path != "/webhooks/gh" || ws.Signature != "github" || len(ws.Secrets) != 1 || ws.Secrets[0].Fingerprint == "gh-secret" ||
		ws.KeyHeader != "X-GitHub-Delivery" || ws.ReplayWindow != "1h" {
		t.Fatalf("the webhook source in the list: %+v %+v %v", gh, ws, err)
	}

	bad := api.PollSourceSettings{URL: upstream.URL, ID: "/id", Type: "/type"} // no items
	if _, _, err := c.CreateSource(ctx, api.CreateSource{Name: "bad", Kind: api.SourcePoll, Settings: settings(bad)}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a poll source without items: %v, want ErrInvalid", err)
	}
	for _, name := range []string{"api", "mirror", "gh"} {
		if err := c.DeleteSource(ctx, name); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	if _, err := c.Source(ctx, "gh"); !client.IsNotFound(err) {
		t.Fatalf("a deleted source: %v, want ErrNotFound", err)
	}
}

// TestDeadLetterQuery: the query of a dead-letter page, keys sorted,
// times in UTC, as the call an error names (APIError.Method, Path).
func TestDeadLetterQuery(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	defer ts.Close()
	c, err := client.NewAPI(ts.URL, client.APIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 11, 21, 11, 0, 0, 5, time.FixedZone("CET", 3600))
	for _, q := range []struct {
		q    client.DeadLetterQuery
		want string
	}{
		{client.DeadLetterQuery{}, "/v1/dead-letters"},
		{client.DeadLetterQuery{Limit: 100}, "/v1/dead-letters?limit=100"},
		{client.DeadLetterQuery{Inbox: "a b", Subscription: "s", From: from, After: 7, Limit: 2},
			"/v1/dead-letters?after=7&from=2026-11-21T10%3A00%3A00.000000005Z&inbox=a+b&limit=2&subscription=s"},
		{client.DeadLetterQuery{To: from}, "/v1/dead-letters?to=2026-11-21T10%3A00%3A00.000000005Z"},
	} {
		_, err := c.DeadLetters(context.Background(), q.q)
		ae, ok := errors.AsType[*client.APIError](err)
		if !ok || ae.Status != http.StatusNotFound || ae.Method != http.MethodGet || ae.Path != q.want {
			t.Errorf("%+v: %v (%+v), want a 404 of GET %s", q.q, err, ae, q.want)
		}
	}
}

// TestCallError: a call that gets no answer names itself and wraps why.
func TestCallError(t *testing.T) {
	ts := httptest.NewServer(http.NotFoundHandler())
	url := ts.URL
	ts.Close()
	c, err := client.NewAPI(url, client.APIOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Subscription(context.Background(), "orders")
	ce, ok := errors.AsType[*client.CallError](err)
	if !ok || ce.Method != http.MethodGet || ce.Path != "/v1/subscriptions/orders" || ce.Err == nil {
		t.Fatalf("a call to a closed server: %v, want a *CallError of GET /v1/subscriptions/orders", err)
	}
}
