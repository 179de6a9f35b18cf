package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// hookTarget is an HTTP target of a subscription: it answers every POST with
// its current status and counts the posts of each item.
type hookTarget struct {
	*httptest.Server
	mu     sync.Mutex
	status int
	posts  map[string]int // by X-Postbox-Item
}

func newHookTarget(t *testing.T, status int) *hookTarget {
	tg := &hookTarget{status: status, posts: map[string]int{}}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		tg.posts[r.Header.Get("X-Postbox-Item")]++
		status := tg.status
		tg.mu.Unlock()
		w.WriteHeader(status)
		fmt.Fprintf(w, "answered %d", status)
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *hookTarget) answer(status int) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.status = status
}

func (tg *hookTarget) postsOf(id string) int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.posts[id]
}

// storeWebhook stores one webhook with idempotency key key.
func storeWebhook(t *testing.T, s *servertest.Server, key, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Event-Type", "invoice.paid")
	resp, err := s.HTTP.Do(req)
	if err != nil {
		t.Fatalf("POST /webhooks: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /webhooks %s: %s, want 202", key, resp.Status)
	}
}

// waitDeadLetters waits until dlq list with the args (and --json) shows n
// dead letters, and returns them.
func waitDeadLetters(t *testing.T, n int, args ...string) []map[string]any {
	t.Helper()
	var items []map[string]any
	testenv.Eventually(t, 20*time.Second, fmt.Sprintf("%d dead letters in dlq list %s", n, strings.Join(args, " ")), func() bool {
		cliJSON(t, &items, append([]string{"dlq", "list", "--json"}, args...)...)
		return len(items) == n
	})
	return items
}

func idOf(item map[string]any) string {
	return strconv.FormatFloat(item["id"].(float64), 'f', -1, 64)
}

// TestDLQReplay makes a dead letter for real (a target answering 410
// Gone), lists and shows it, replays it to a target that now answers 200,
// and sees it completed with one more post; then replays a selection.
func TestDLQReplay(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	srv := []string{"--server", s.Base}
	tg := newHookTarget(t, http.StatusGone)

	r := cli(t, append([]string{"subscriptions", "create", "hooks", "--source", "webhooks", "--target", tg.URL + "/in"}, srv...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "created subscription hooks on webhooks (start latest) → inbox hooks → POST "+tg.URL+"/in" {
		t.Fatalf("subscriptions create --target: %v", r)
	}
	var sub map[string]any
	cliJSON(t, &sub, append([]string{"subscriptions", "get", "hooks", "--json"}, srv...)...)
	if sub["target"] != tg.URL+"/in" {
		t.Fatalf("subscriptions get --json: target %v, want %s/in", sub["target"], tg.URL)
	}
	if r := cli(t, append([]string{"subscriptions", "get", "hooks"}, srv...)...); r.code != 0 || !strings.Contains(r.stdout, "target:") || !strings.Contains(r.stdout, tg.URL+"/in") {
		t.Fatalf("subscriptions get: %v", r)
	}
	r = cli(t, append([]string{"subscriptions", "list"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "TARGET") || !strings.Contains(r.stdout, tg.URL+"/in") {
		t.Fatalf("subscriptions list: %v", r)
	}
	var subs []map[string]any
	cliJSON(t, &subs, append([]string{"subscriptions", "list", "--json"}, srv...)...)
	for _, sub := range subs {
		if want := map[string]any{"hooks": tg.URL + "/in", "webhooks": nil}[sub["name"].(string)]; sub["target"] != want {
			t.Errorf("subscriptions list --json: %s has target %v, want %v", sub["name"], sub["target"], want)
		}
	}

	storeWebhook(t, s, "delivery-1", `{"amount":42}`)
	items := waitDeadLetters(t, 1, srv...)
	id := idOf(items[0])
	if it := items[0]; it["inbox"] != "hooks" || it["subscription"] != "hooks" || it["state"] != "failed" || it["failed_at"] == nil ||
		!strings.Contains(fmt.Sprint(it["last_error"]), "410 Gone") {
		t.Fatalf("dlq list --json: %v", it)
	}
	if n := tg.postsOf(id); n != 1 {
		t.Fatalf("the target got item %s %d times before the replay, want 1 (410 dead-letters at once)", id, n)
	}
	r = cli(t, append([]string{"dlq", "list"}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "FAILED_AT") || !strings.Contains(r.stdout, "LAST_ERROR") ||
		!strings.HasPrefix(strings.Split(r.stdout, "\n")[1], id+" ") || !strings.Contains(r.stdout, "410 Gone") {
		t.Fatalf("dlq list: %v", r)
	}
	for _, sel := range [][]string{{"--inbox", "hooks"}, {"--subscription", "hooks"}, {"--since", "1h"}, {"--until", "1m", "--since", time.Now().Add(-time.Hour).Format(time.RFC3339)}, {"--from", "1h"}} {
		want := 1
		if slices.Contains(sel, "--until") {
			want = 0 // it failed less than a minute ago
		}
		var got []map[string]any
		cliJSON(t, &got, append(append([]string{"dlq", "list", "--json"}, sel...), srv...)...)
		if len(got) != want {
			t.Errorf("dlq list %s: %d dead letters, want %d", strings.Join(sel, " "), len(got), want)
		}
	}
	var none []map[string]any
	cliJSON(t, &none, append([]string{"dlq", "list", "--inbox", "webhooks", "--json"}, srv...)...)
	if len(none) != 0 {
		t.Fatalf("dlq list --inbox webhooks: %v, want none", none)
	}

	var shown map[string]any
	cliJSON(t, &shown, append([]string{"dlq", "show", id, "--json"}, srv...)...)
	if idOf(shown) != id || shown["state"] != "failed" || shown["replays"] != 0.0 || shown["replayed_at"] != nil {
		t.Fatalf("dlq show --json: %v", shown)
	}
	r = cli(t, append([]string{"dlq", "show", id}, srv...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "failed_at:") || !strings.Contains(r.stdout, "410 Gone") || !strings.Contains(r.stdout, `"amount": 42`) {
		t.Fatalf("dlq show: %v", r)
	}
	// The webhook's headers as a person reads them, not a Go map.
	if !strings.Contains(r.stdout, "metadata:\n  headers:\n    Content-Type: application/json\n    Idempotency-Key: delivery-1\n") ||
		!strings.Contains(r.stdout, "    X-Event-Type: invoice.paid\n") || strings.Contains(r.stdout, "map[") {
		t.Fatalf("dlq show: the headers are not Name: value lines:\n%s", r.stdout)
	}

	tg.answer(http.StatusOK)
	r = cli(t, append([]string{"dlq", "replay", id}, srv...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "replayed 1 dead letter (item "+id+"): pending again" {
		t.Fatalf("dlq replay %s: %v", id, r)
	}
	var item map[string]any
	testenv.Eventually(t, 20*time.Second, "the replayed item to be completed", func() bool {
		cliJSON(t, &item, append([]string{"inbox", "show", "hooks", id, "--json"}, srv...)...)
		return item["state"] == "completed"
	})
	if n := tg.postsOf(id); n != 2 {
		t.Fatalf("the target got item %s %d times, want 2: once dead-lettered, once after the replay", id, n)
	}
	if item["replays"] != 1.0 || item["replayed_at"] == nil || item["failed_at"] != nil {
		t.Fatalf("the replayed item: %v", item)
	}
	if r := cli(t, append([]string{"dlq", "show", id}, srv...)...); r.code != 1 || !strings.Contains(r.stderr, "404 not_found") || !strings.Contains(r.stderr, "not a dead letter") {
		t.Fatalf("dlq show of a completed item: %v", r)
	}
	if r := cli(t, append([]string{"dlq", "replay", id}, srv...)...); r.code != 1 || !strings.Contains(r.stderr, "409 invalid_state") || !strings.Contains(r.stderr, "not a dead letter") {
		t.Fatalf("dlq replay of a completed item: %v", r)
	}
	for _, sub := range []string{"show", "replay"} {
		r := cli(t, append([]string{"dlq", sub, "999999"}, srv...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "dlq "+sub+" 999999: server: 404 not_found: ") || !strings.Contains(r.stderr, "no such item") {
			t.Errorf("dlq %s of an unknown id: %v", sub, r)
		}
	}

	// Two more dead letters: pages, and a replay by selection.
	tg.answer(http.StatusGone)
	storeWebhook(t, s, "delivery-2", `{"amount":7}`)
	storeWebhook(t, s, "delivery-3", `{"amount":8}`)
	items = waitDeadLetters(t, 2, srv...)
	r = cli(t, append([]string{"dlq", "list", "--limit", "1"}, srv...)...)
	if r.code != 0 || strings.Count(r.stdout, "410 Gone") != 1 || !strings.Contains(r.stderr, "more items: --after "+idOf(items[0])+", or --all-pages") {
		t.Fatalf("dlq list --limit 1: %v", r)
	}
	var pages []map[string]any
	cliJSON(t, &pages, append([]string{"dlq", "list", "--limit", "1", "--all-pages", "--json"}, srv...)...)
	if len(pages) != 2 || idOf(pages[0]) != idOf(items[0]) || idOf(pages[1]) != idOf(items[1]) {
		t.Fatalf("dlq list --limit 1 --all-pages: %v, want %v", pages, items)
	}
	var replayed struct {
		Replayed int     `json:"replayed"`
		IDs      []int64 `json:"ids"`
	}
	cliJSON(t, &replayed, append([]string{"dlq", "replay", "--subscription", "hooks", "--since", "10m", "--json"}, srv...)...)
	slices.Sort(replayed.IDs)
	if replayed.Replayed != 2 || len(replayed.IDs) != 2 || strconv.FormatInt(replayed.IDs[0], 10) != idOf(items[0]) || strconv.FormatInt(replayed.IDs[1], 10) != idOf(items[1]) {
		t.Fatalf("dlq replay --subscription hooks --json: %+v, want the ids of %v", replayed, items)
	}
	waitDeadLetters(t, 2, srv...) // the target still answers 410
	r = cli(t, append([]string{"dlq", "replay", "--all"}, srv...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "replayed 2 dead letters: pending again" {
		t.Fatalf("dlq replay --all: %v", r)
	}
	r = cli(t, append([]string{"dlq", "replay", "--inbox", "nosuchinbox"}, srv...)...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "no dead letters selected: replayed none" {
		t.Fatalf("dlq replay of an empty selection: %v", r)
	}
	cliJSON(t, &replayed, append([]string{"dlq", "replay", "--inbox", "nosuchinbox", "--json"}, srv...)...)
	if replayed.Replayed != 0 || replayed.IDs == nil || len(replayed.IDs) != 0 {
		t.Fatalf("dlq replay --json of an empty selection: %+v", replayed)
	}
}

func TestDLQUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq"}, "dlq: no command given"},
		{[]string{"dlq", "purge"}, `unknown command "purge"`},
		{[]string{"dlq", "show"}, "ID is required"},
		{[]string{"dlq", "show", "abc"}, `item ID "abc" is not a positive whole number`},
		{[]string{"dlq", "show", "1", "2"}, "takes one ID"},
		{[]string{"dlq", "replay"}, "name an ID, or select dead letters with --inbox, --subscription, --since or --until, or replay every one with --all"},
		{[]string{"dlq", "replay", "0"}, `item ID "0"`},
		{[]string{"dlq", "replay", "5", "--inbox", "hooks"}, "an ID goes alone"},
		{[]string{"dlq", "replay", "5", "--all"}, "an ID goes alone"},
		{[]string{"dlq", "replay", "--all", "--subscription", "hooks"}, "--all replays every dead letter"},
		{[]string{"dlq", "replay", "--since", "yesterday"}, `--since "yesterday" is neither an RFC 3339 time`},
		{[]string{"dlq", "replay", "--from", "yesterday"}, `--since "yesterday" is neither an RFC 3339 time`},
		{[]string{"dlq", "list", "--from", "1h", "--since", "2h"}, "--from is the old spelling of --since: give --since alone"},
		{[]string{"dlq", "list", "--sinse", "1h"}, "flag provided but not defined: -sinse (did you mean --since?)"},
		{[]string{"dlq", "lst"}, `unknown command "lst" (did you mean list?)`},
		{[]string{"dlq", "replay", "--inbox", "a/b"}, `--inbox "a/b" may hold only`},
		{[]string{"dlq", "list", "--until", "2026-13-01T00:00:00Z"}, "--until"},
		{[]string{"dlq", "list", "--since", "-1h"}, `--since "-1h"`},
		{[]string{"dlq", "list", "--since", "1h", "--until", "2h"}, "is not before --until"},
		{[]string{"dlq", "list", "--limit", "5000"}, "--limit is at most 1000"},
		{[]string{"dlq", "list", "hooks"}, "takes no arguments"},
		{[]string{"dlq", "list", "--server", "localhost:8000"}, `--server "localhost:8000": want http://HOST:PORT`},
		{[]string{"subscriptions", "create", "hooks", "--source", "webhooks", "--target", "ftp://example.com/in"}, `"ftp://example.com/in" is not an http:// or https:// URL`},
	} {
		r := cli(t, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("postbox %s: want exit 2 and %q on stderr; %v", strings.Join(tc.args, " "), tc.want, r)
		}
	}
	r := cli(t, "dlq", "list", "--server", "http://127.0.0.1:1")
	if r.code != 1 || !strings.Contains(r.stderr, "no server answers at http://127.0.0.1:1") {
		t.Errorf("dlq list with no server: %v", r)
	}
}

func TestDLQHelp(t *testing.T) {
	for _, args := range [][]string{{"dlq", "--help"}, {"dlq", "list", "--help"}, {"dlq", "show", "-h"}, {"dlq", "replay", "--help"}} {
		r := cli(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: postbox dlq") {
			t.Errorf("postbox %s: %v", strings.Join(args, " "), r)
		}
		if len(args) == 3 && (!strings.Contains(r.stdout, "-server URL") || !strings.Contains(r.stdout, "-token") || !strings.Contains(r.stdout, "-json")) {
			t.Errorf("postbox %s: no --server, --token or --json in the flags:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	if r := cli(t, "dlq", "replay", "--help"); !strings.Contains(r.stdout, "-all") || !strings.Contains(r.stdout, "7d") {
		t.Errorf("dlq replay --help: %v", r)
	}
	if r := cli(t, "--help"); !strings.Contains(r.stdout, "  dlq ") {
		t.Errorf("postbox --help does not list dlq:\n%s", r.stdout)
	}
}

func TestDLQParseWhen(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-20T10:00:00Z":      time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC),
		"2026-11-20T11:00:00+01:00": time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC),
		"90m":                       now.Add(-90 * time.Minute),
		"2h30m":                     now.Add(-150 * time.Minute),
		"0s":                        now,
		"7d":                        now.Add(-7 * 24 * time.Hour),
	} {
		got, err := parseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "yesterday", "-1h", "1.5d", "-2d", "2026-11-20", "99999999d"} {
		if got, err := parseWhen(in, now); err == nil {
			t.Errorf("parseWhen(%q) = %v, want an error", in, got)
		}
	}
}

// TestDLQAPIToken: the dead-letter commands send the API token.
func TestDLQAPIToken(t *testing.T) {
	s := servertest.Start(t, server.Config{APIToken: "s3cret"}, nil)
	if r := cli(t, "dlq", "list", "--server", s.Base); r.code != 1 || !strings.Contains(r.stderr, "401 unauthorized") {
		t.Fatalf("dlq list without the token: %v", r)
	}
	var items []map[string]any
	cliJSON(t, &items, "dlq", "list", "--server", s.Base, "--token", "s3cret", "--json")
	if items == nil || len(items) != 0 {
		t.Fatalf("dlq list --json of no dead letters: %v, want []", items)
	}
	r := cliEnv(t, map[string]string{"POSTBOX_API_TOKEN": "s3cret", "POSTBOX_SERVER": s.Base}, "dlq", "replay", "--all", "--json")
	var out map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || out["replayed"] != 0.0 {
		t.Fatalf("dlq replay --all with POSTBOX_API_TOKEN: %v", r)
	}
}

// TestSubscriptionsSetTarget changes a subscription's target and removes
// it.
func TestSubscriptionsSetTarget(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	srv := []string{"--server", s.Base}
	tg := newHookTarget(t, http.StatusOK)
	if r := cli(t, append([]string{"subscriptions", "set-target", "webhooks", "--target", tg.URL}, srv...)...); r.code != 0 ||
		strings.TrimSpace(r.stdout) != "subscription webhooks: target "+tg.URL {
		t.Fatalf("set-target: %v", r)
	}
	storeWebhook(t, s, "st-1", `{}`)
	testenv.Eventually(t, 10*time.Second, "the target to get the webhook", func() bool { return tg.postsOf("1") == 1 })
	var sub map[string]any
	cliJSON(t, &sub, append([]string{"subscriptions", "set-target", "webhooks", "--none", "--json"}, srv...)...)
	if sub["target"] != nil {
		t.Fatalf("set-target --none --json: %v", sub)
	}
	for _, args := range [][]string{{"webhooks"}, {"webhooks", "--none", "--target", tg.URL}, {"webhooks", "--target", "ftp://x"}} {
		if r := cli(t, append(append([]string{"subscriptions", "set-target"}, args...), srv...)...); r.code != 2 {
			t.Errorf("set-target %v: %v, want a usage error", args, r)
		}
	}
	if r := cli(t, append([]string{"subscriptions", "set-target", "nope", "--none"}, srv...)...); r.code != 1 || !strings.Contains(r.stderr, "404") {
		t.Errorf("set-target of an unknown subscription: %v", r)
	}
}
