package main_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// gitHubStandIn is a local stand-in for GitHub's REST API: it answers the
// first fail comments 503, then 201, and keeps what it was sent.
type gitHubStandIn struct {
	*httptest.Server
	mu    sync.Mutex
	fail  int
	calls []gitHubCall
}

type gitHubCall struct {
	method, path, auth, body string
}

func newGitHubStandIn(t *testing.T, fail int) *gitHubStandIn {
	g := &gitHubStandIn{fail: fail}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		g.calls = append(g.calls, gitHubCall{r.Method, r.URL.Path, r.Header.Get("Authorization"), string(body)})
		n := len(g.calls)
		g.mu.Unlock()
		if n <= g.fail {
			http.Error(w, `{"message":"Service Unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1,"body":"ok"}`)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gitHubStandIn) seen() []gitHubCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]gitHubCall(nil), g.calls...)
}

// TestReplyToGitHub: a GitHub-preset webhook about an issue comment makes
// an item whose delivery handle names the issue's comments endpoint on
// the source's API (a local stand-in for GitHub); `postbox inbox reply`
// posts a comment there with the source's credentials, read from the
// server's environment; the stand-in's 503 is retried; the server is
// killed with SIGKILL while the reply waits for its retry and the reply
// still goes, once; replying again with the same key sends nothing more;
// a device event's reply is refused with the reason.
func TestReplyToGitHub(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	const secret = "gh-secret"
	gh := newGitHubStandIn(t, 2)
	t.Setenv("GH_REPLY_AUTH", "Bearer ghp_test")
	addr, db := freePort(t), filepath.Join(t.TempDir(), "postbox.db")
	base := "http://" + addr
	srv := start(t, "serve", "--addr", addr, "--db", db, "--log-level", "warn", "--retry-base-delay", "1s", "--retry-max-delay", "1s",
		"--handler-timeout", "2s")
	waitHTTP(t, base+"/ready", srv)

	settings := `{"preset":"github","secrets":["` + secret + `"],"api_url":"` + gh.URL + `","reply":{"headers":{"Authorization":"env:GH_REPLY_AUTH"}}}`
	resp, err := http.Post(base+"/v1/sources", "application/json", strings.NewReader(`{"name":"gh","kind":"webhook","settings":`+settings+`}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create source gh: %s", resp.Status)
	}
	if out, errOut, code := runCLI(t, base, "subscriptions", "create", "triage", "--source", "gh", "--start", "earliest"); code != 0 {
		t.Fatalf("subscriptions create: %s %s", out, errOut)
	}
	body := `{"action":"created","issue":{"number":12,"title":"It breaks"},"comment":{"id":7,"body":"help"},"repository":{"full_name":"octo/hello"}}`
	req, _ := http.NewRequest(http.MethodPost, base+"/webhooks/gh", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Delivery", "d-1")
	req.Header.Set("X-GitHub-Event", "issue_comment")
	req.Header.Set("X-Hub-Signature-256", webhooksig.SignGitHub(secret, []byte(body)))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the webhook: %s", resp.Status)
	}
	var items []struct {
		ID     int64           `json:"id"`
		Handle json.RawMessage `json:"delivery_handle"`
	}
	testenv.Eventually(t, 10*time.Second, "the item in triage", func() bool {
		out, _, _ := runCLI(t, base, "inbox", "list", "triage", "--json")
		return json.Unmarshal([]byte(out), &items) == nil && len(items) == 1
	})
	var handle struct {
		Kind, URL, Repository string
		Issue                 int
	}
	if err := json.Unmarshal(items[0].Handle, &handle); err != nil || handle.Kind != "github" || handle.Repository != "octo/hello" ||
		handle.Issue != 12 || handle.URL != gh.URL+"/repos/octo/hello/issues/12/comments" {
		t.Fatalf("the item's delivery handle: %s (%v)", items[0].Handle, err)
	}
	id := strconv.FormatInt(items[0].ID, 10)

	out, errOut, code := runCLI(t, base, "inbox", "reply", "triage", id, "--key", "ack", "--body", `{"body":"On it."}`)
	if code != 0 || !strings.Contains(out, "reply ack to item "+id+" of triage: pending, to "+handle.URL) {
		t.Fatalf("inbox reply: %d %s %s", code, out, errOut)
	}
	testenv.Eventually(t, 30*time.Second, "the first attempt at the stand-in", func() bool { return len(gh.seen()) >= 1 })
	// Killed while the reply waits for its retry (or is in its attempt):
	// stored, it is sent after the restart.
	srv.kill()
	srv.restart()
	waitHTTP(t, base+"/ready", srv)
	var replies []struct {
		State    string `json:"state"`
		Attempts int    `json:"attempts"`
		Log      []struct {
			Status int `json:"status_code"`
		} `json:"attempt_log"`
	}
	testenv.Eventually(t, time.Minute, "the reply to complete", func() bool {
		out, _, _ := runCLI(t, base, "inbox", "replies", "triage", id, "--json")
		return json.Unmarshal([]byte(out), &replies) == nil && len(replies) == 1 && replies[0].State == "completed"
	})
	calls := gh.seen()
	if len(calls) != 3 {
		t.Errorf("the stand-in got %d requests, want 3 (503, 503, 201): %+v", len(calls), calls)
	}
	for _, c := range calls {
		if c.method != http.MethodPost || c.path != "/repos/octo/hello/issues/12/comments" || c.auth != "Bearer ghp_test" || c.body != `{"body":"On it."}` {
			t.Errorf("a request to the stand-in: %+v", c)
		}
	}
	if n := len(replies[0].Log); n < 2 || replies[0].Log[n-1].Status != 201 || replies[0].Log[0].Status != 503 {
		t.Errorf("the attempt log: %+v", replies[0].Log)
	}

	// Again with the key: the reply as it is, nothing sent.
	out, _, code = runCLI(t, base, "inbox", "reply", "triage", id, "--key", "ack", "--body", `{"body":"On it."}`)
	if code != 0 || !strings.Contains(out, "completed") {
		t.Fatalf("inbox reply again: %d %s", code, out)
	}
	if _, errOut, code := runCLI(t, base, "inbox", "reply", "triage", id, "--key", "ack", "--body", `{"body":"Other"}`); code != 1 || !strings.Contains(errOut, "409") {
		t.Errorf("another body under the key: %d %s, want exit 1 and a 409", code, errOut)
	}
	time.Sleep(1500 * time.Millisecond) // a retry would come within the second
	if n := len(gh.seen()); n != 3 {
		t.Errorf("the stand-in got %d requests after the reply completed, want 3", n)
	}
	if _, errOut, code := runCLI(t, base, "inbox", "reply", "triage", "99999", "--body", `{}`); code != 1 || !strings.Contains(errOut, "404") {
		t.Errorf("a reply to no item: %d %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, base, "inbox", "reply", "triage", id, "--body", `{"body":`); code != 2 || !strings.Contains(errOut, "not valid JSON") {
		t.Errorf("a reply that is not JSON: %d %s", code, errOut)
	}
}
