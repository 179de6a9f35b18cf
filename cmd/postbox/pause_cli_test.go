package main_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestPauseResumeTestCLI: subscriptions pause, resume and test, their
// output, exit codes and refusals.
func TestPauseResumeTestCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	var down atomic.Bool
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "not now", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("thanks"))
	}))
	t.Cleanup(tg.Close)
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "billing", "--source", "webhooks", "--target", tg.URL); code != 0 {
		t.Fatalf("create: %d %s %s", code, out, errOut)
	}

	out, errOut, code := runCLI(t, s.Base, "subscriptions", "pause", "billing", "--reason", "billing deploy")
	if code != 0 || !strings.Contains(out, "subscription billing: paused since") || !strings.Contains(out, "billing deploy") {
		t.Fatalf("pause: %d %q %q", code, out, errOut)
	}
	out, _, _ = runCLI(t, s.Base, "subscriptions", "get", "billing")
	if !strings.Contains(out, "paused since") || !strings.Contains(out, "billing deploy") {
		t.Errorf("get of a paused subscription:\n%s", out)
	}
	var sub map[string]any
	out, _, _ = runCLI(t, s.Base, "subscriptions", "resume", "billing", "--json")
	if err := json.Unmarshal([]byte(out), &sub); err != nil || sub["paused"] != false {
		t.Fatalf("resume --json: %v %s", err, out)
	}

	out, errOut, code = runCLI(t, s.Base, "subscriptions", "test", "billing")
	if code != 0 || !strings.Contains(out, ": 200 in ") || !strings.Contains(out, "answer: thanks") {
		t.Fatalf("test: %d %q %q", code, out, errOut)
	}
	down.Store(true)
	out, errOut, code = runCLI(t, s.Base, "subscriptions", "test", "billing")
	if code != 1 || !strings.Contains(out, ": 503 in ") || !strings.Contains(errOut, "did not answer 2xx") {
		t.Fatalf("test of a failing endpoint: %d %q %q", code, out, errOut)
	}

	for _, c := range []struct {
		args     []string
		code     int
		mentions string
	}{
		{[]string{"pause"}, 2, "NAME"},
		{[]string{"pause", "nope"}, 1, "nope"},
		{[]string{"resume", "nope"}, 1, "nope"},
		{[]string{"pause", "billing", "--reason", strings.Repeat("x", 501)}, 1, "reason"},
		{[]string{"test", "nope"}, 1, "nope"},
	} {
		_, errOut, code := runCLI(t, s.Base, append([]string{"subscriptions"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.mentions) {
			t.Errorf("subscriptions %v: exit %d %q, want %d naming %s", c.args, code, errOut, c.code, c.mentions)
		}
	}
}

// TestCancelDiscardCLI: inbox cancel and discard, and dlq discard by ids
// and by selection, with their refusals.
func TestCancelDiscardCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "jobs", "--source", "webhooks", "--start", "earliest"); code != 0 {
		t.Fatalf("create: %d %s %s", code, out, errOut)
	}
	for i := range 4 {
		req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "cli-"+strconv.Itoa(i))
		resp, err := s.HTTP.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	var ids []string
	testenv.Eventually(t, 30*time.Second, "4 pending items", func() bool {
		var items []struct{ ID int64 }
		out, _, _ := runCLI(t, s.Base, "inbox", "list", "jobs", "--state", "pending", "--json")
		if json.Unmarshal([]byte(out), &items) != nil {
			return false
		}
		ids = ids[:0]
		for _, it := range items {
			ids = append(ids, strconv.FormatInt(it.ID, 10))
		}
		return len(ids) == 4
	})
	for _, id := range ids[:3] {
		out, errOut, code := runCLI(t, s.Base, "inbox", "cancel", "jobs", id, "--reason", "test run")
		if code != 0 || !strings.Contains(out, "failed, cancelled by an operator: test run") {
			t.Fatalf("inbox cancel %s: %d %q %q", id, code, out, errOut)
		}
	}
	if _, errOut, code := runCLI(t, s.Base, "inbox", "cancel", "jobs", ids[0]); code != 1 || !strings.Contains(errOut, "only a pending item") {
		t.Errorf("cancel of a dead letter: %d %q", code, errOut)
	}
	if out, errOut, code := runCLI(t, s.Base, "inbox", "discard", "jobs", ids[3]); code != 0 || !strings.Contains(out, "discarded (it was pending)") {
		t.Errorf("inbox discard: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, s.Base, "dlq", "discard", ids[0], ids[3]); code != 0 || !strings.Contains(out, "discarded 1 dead letter (item "+ids[0]+")") {
		t.Errorf("dlq discard by ids: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, s.Base, "dlq", "discard", "--inbox", "jobs"); code != 0 || !strings.Contains(out, "discarded 2 dead letters") {
		t.Errorf("dlq discard --inbox: %d %q %q", code, out, errOut)
	}
	for _, c := range []struct {
		args     []string
		code     int
		mentions string
	}{
		{[]string{"dlq", "discard"}, 2, "--all"},
		{[]string{"dlq", "discard", "--all", "--inbox", "jobs"}, 2, "--all"},
		{[]string{"dlq", "discard", "x"}, 2, "x"},
		{[]string{"inbox", "cancel", "jobs"}, 2, "INBOX and one item ID"},
		{[]string{"inbox", "discard", "jobs", "999999"}, 1, "999999"},
	} {
		_, errOut, code := runCLI(t, s.Base, c.args...)
		if code != c.code || !strings.Contains(errOut, c.mentions) {
			t.Errorf("%v: exit %d %q, want %d naming %s", c.args, code, errOut, c.code, c.mentions)
		}
	}
}
