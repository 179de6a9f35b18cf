package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestSourcesPollCLI: sources create --poll with a poll source's flags makes
// a poll source that stores the API's items; get shows its settings (the
// header as env:NAME) and its checkpoint; get --json has it under
// checkpoint; bad flags are usage errors naming them.
func TestSourcesPollCLI(t *testing.T) {
	t.Setenv("CLI_GH_TOKEN", "Bearer cli")
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer cli" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("after") == "" {
			fmt.Fprint(w, `{"events":[{"id":1,"type":"push","created_at":"2026-01-02T03:04:05Z"}],"next_cursor":"c1"}`)
			return
		}
		fmt.Fprint(w, `{"events":[{"id":2,"type":"fork","created_at":"2026-01-02T03:04:06Z"}],"next_cursor":null}`)
	}))
	defer api.Close()
	s := servertest.Start(t, server.Config{}, nil)
	out, errOut, code := runCLI(t, s.Base, "sources", "create", "gh", "--poll", api.URL+"/events", "--items", "/events", "--id", "/id",
		"--type", "/type", "--time", "/created_at", "--cursor-param", "after", "--next", "/next_cursor", "--interval", "100ms",
		"--header", "Authorization: env:CLI_GH_TOKEN")
	if code != 0 || !strings.HasPrefix(out, "created source gh (poll) → stream gh; polling "+api.URL+"/events every 100ms") {
		t.Fatalf("sources create --poll: %d %s %s", code, out, errOut)
	}
	var got struct {
		Checkpoint struct {
			Cursor      string `json:"cursor"`
			LastEventAt string `json:"last_event_at"`
		} `json:"checkpoint"`
	}
	testenv.Eventually(t, 20*time.Second, "the checkpoint at the second page", func() bool {
		out, _, _ := runCLI(t, s.Base, "sources", "get", "gh", "--json")
		return json.Unmarshal([]byte(out), &got) == nil && got.Checkpoint.Cursor == "c1" && got.Checkpoint.LastEventAt == "2026-01-02T03:04:06Z"
	})
	out, _, code = runCLI(t, s.Base, "sources", "get", "gh")
	for _, want := range []string{"kind:", "poll", api.URL + "/events", `"/events"`, "/created_at", "after from /next_cursor",
		"Authorization: env:CLI_GH_TOKEN", "cursor c1", "same-origin"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("sources get: want %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, "Bearer cli") {
		t.Errorf("sources get shows the header's value:\n%s", out)
	}
	out, _, code = runCLI(t, s.Base, "sources", "list")
	if code != 0 || !strings.Contains(out, "gh ") || !strings.Contains(out, "poll") || !strings.Contains(out, api.URL+"/events") {
		t.Errorf("sources list: %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--poll", api.URL, "--id", "/id", "--type", "/type"}, "--poll needs --items"},
		{[]string{"--poll", api.URL, "--items", "/e", "--type", "/type"}, "--poll needs --id"},
		{[]string{"--poll", api.URL, "--items", "e", "--id", "/id", "--type", "/t"}, `settings.items: JSON pointer "e": starts with /`},
		{[]string{"--poll", "not a url", "--items", "/e", "--id", "/id", "--type", "/t"}, `settings.url "not a url"`},
		{[]string{"--poll", api.URL, "--items", "/e", "--id", "/id", "--type", "/t", "--next", "/n"}, "--cursor-param and --next go together"},
		{[]string{"--poll", api.URL, "--feed", api.URL}, "--poll and --feed: give one"},
		{[]string{"--items", "/e"}, "--items is a poll or feed source's"},
		{[]string{"--poll", api.URL, "--items", "/e", "--id", "/id", "--type", "/t", "--header", "nocolon"}, `header "nocolon": want 'Name: value'`},
		{[]string{"--feed", "http://x:8000/"}, "settings.url"},
		{[]string{"--poll", api.URL, "--items", "/e", "--id", "/id", "--type", "/t", "--redirects", "always"}, `settings.redirects "always": want same-origin`},
		{[]string{"--redirects", "none"}, "--redirects is a poll or feed source's"},
	} {
		out, errOut, code := runCLI(t, s.Base, append([]string{"sources", "create", "bad"}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("sources create %v: %d %s %s; want an error with %q", c.args, code, out, errOut, c.want)
		}
	}
}
