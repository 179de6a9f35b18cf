package server_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// TestGitHubReplayWindow: GitHub signs the body alone, so a captured
// delivery verifies again under any X-GitHub-Delivery and X-GitHub-Event.
// Within a github source's replay window (24h by default) the same signed
// body under another delivery id is the duplicate of the first, whatever
// its event header says, also when replays come at once; GitHub's own
// redelivery (the same id) is the duplicate it always was. After the
// window, or with a window of 0, the body is stored again: what remains.
func TestGitHubReplayWindow(t *testing.T) {
	var ahead atomic.Int64 // how far the store's clock is ahead of the wall's
	now := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	ts := servertest.Start(t, server.Config{Delivery: delivery.Config{Now: now}}, nil)
	const secret = "gh webhook secret"
	st, src := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["`+secret+`"]}}`, nil)
	if settings, _ := src["settings"].(map[string]any); st != 201 || settings["replay_window"] != "24h" {
		t.Fatalf("create gh: %d %v, want replay_window 24h", st, src)
	}
	deliver := func(source, id, event, body string) (int, map[string]any) {
		t.Helper()
		return srcCall(t, ts, "POST", "/webhooks/"+source, body, map[string]string{"X-GitHub-Delivery": id, "X-GitHub-Event": event,
			"X-Hub-Signature-256": webhooksig.SignGitHub(secret, []byte(body))})
	}
	body := `{"action":"opened","issue":{"number":7}}`
	if st, ans := deliver("gh", "d-1", "issues", body); st != 202 || ans["id"] != "wh_gh_1" {
		t.Fatalf("the delivery: %d %v", st, ans)
	}
	for _, id := range []string{"replay-1", "replay-2"} { // replays under new ids, as another event
		if st, ans := deliver("gh", id, "push", body); st != http.StatusOK || ans["id"] != "wh_gh_1" || ans["idempotency_key"] != "d-1" {
			t.Fatalf("%s of the body as push: %d %v, want 200 wh_gh_1 under d-1", id, st, ans)
		}
	}
	if st, ans := deliver("gh", "d-1", "issues", body); st != http.StatusOK {
		t.Fatalf("GitHub's redelivery of d-1: %d %v, want 200", st, ans)
	}
	// Replays at once, each under its own id: one is stored.
	burst := `{"action":"closed","issue":{"number":8}}`
	statuses := make([]int, 8)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Go(func() { statuses[i], _ = deliver("gh", "burst-"+strconv.Itoa(i), "issues", burst) })
	}
	wg.Wait()
	stored := 0
	for _, s := range statuses {
		switch s {
		case 202:
			stored++
		case 200, 409: // the first's duplicate, or its append still in flight
		default:
			t.Fatalf("replays at once: statuses %v", statuses)
		}
	}
	if stored != 1 {
		t.Fatalf("replays at once: statuses %v, want one 202", statuses)
	}
	if got := storedPayloads(t, ts, "gh"); len(got) != 2 || got["d-1"] != body {
		t.Fatalf("stored %v, want d-1 and one burst", got)
	}
	ev, err := ts.Srv.Streams().Lookup(testCtx(t, 10*time.Second), "gh", "d-1", "")
	if err != nil || ev.Type != "issues" {
		t.Fatalf("d-1 stored as %q (%v), want issues: a replay does not re-type it", ev.Type, err)
	}

	// After the window the body is a delivery like any other.
	ahead.Store(int64(24*time.Hour + time.Second))
	if st, ans := deliver("gh", "replay-3", "push", body); st != 202 || ans["idempotency_key"] != "replay-3" {
		t.Fatalf("a replay after the window: %d %v, want 202 (what the window leaves)", st, ans)
	}

	// replay_window 0: no window, as before.
	if st, src := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh0", "kind": "webhook", "settings": {"preset": "github", "secrets": ["`+secret+`"], "replay_window": "0"}}`, nil); st != 201 {
		t.Fatalf("create gh0: %d %v", st, src)
	}
	deliver("gh0", "d-1", "issues", body)
	if st, ans := deliver("gh0", "replay-1", "push", body); st != 202 {
		t.Fatalf("a replay without a window: %d %v, want 202", st, ans)
	}
}

// TestReplayWindowSettings: replay_window is a duration from 0 to 90
// days, and only the github preset's; others are 400 naming it.
func TestReplayWindowSettings(t *testing.T) {
	ts := servertest.Start(t, server.Config{}, nil)
	for i, settings := range []string{
		`{"preset": "github", "secrets": ["s"], "replay_window": "soon"}`,
		`{"preset": "github", "secrets": ["s"], "replay_window": "-1h"}`,
		`{"preset": "github", "secrets": ["s"], "replay_window": "2400h"}`,
		`{"preset": "stripe", "secrets": ["s"], "replay_window": "1h"}`,
		`{"replay_window": "1h"}`,
		`{"serve_flags": true, "replay_window": "1h"}`, // named as serve_flags: "give no other"
	} {
		st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "s`+strconv.Itoa(i)+`", "kind": "webhook", "settings": `+settings+`}`, nil)
		if msg := errorMessage(body); st != 400 || !strings.Contains(msg, "replay_window") && !strings.Contains(msg, "serve_flags") {
			t.Errorf("%s: %d %v, want 400 naming settings.replay_window", settings, st, body)
		}
	}
	st, body := srcCall(t, ts, "POST", "/v1/sources", `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["s"], "replay_window": "90m"}}`, nil)
	if settings, _ := body["settings"].(map[string]any); st != 201 || settings["replay_window"] != "1h30m" {
		t.Fatalf("replay_window 90m: %d %v", st, body)
	}
}
