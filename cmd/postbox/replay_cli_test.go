package main_test

import (
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

// TestReplayCLI: subscriptions replay --wait delivers the completed items
// of a range again, printing its progress on stderr and the job's id;
// replays get shows it; bad input is refused naming it.
func TestReplayCLI(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	var calls atomic.Int64
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	t.Cleanup(tg.Close)
	if out, errOut, code := runCLI(t, s.Base, "subscriptions", "create", "hooks", "--source", "webhooks", "--target", tg.URL); code != 0 {
		t.Fatalf("subscriptions create: %d %s %s", code, out, errOut)
	}
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(`{"n": `+strconv.Itoa(i)+`}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "replay-cli-"+strconv.Itoa(i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("webhook: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	testenv.Eventually(t, 10*time.Second, "3 deliveries", func() bool { return calls.Load() == 3 })
	testenv.Eventually(t, 10*time.Second, "the items to be completed", func() bool {
		out, _, code := runCLI(t, s.Base, "inbox", "list", "hooks", "--state", "completed", "--json")
		return code == 0 && strings.Count(out, `"id"`) == 3
	})

	out, errOut, code := runCLI(t, s.Base, "subscriptions", "replay", "hooks", "--since", "1h", "--wait")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "rpl_") || !strings.Contains(errOut, "completed, 3 of 3 items replayed") {
		t.Fatalf("subscriptions replay: %d %q %q", code, out, errOut)
	}
	testenv.Eventually(t, 10*time.Second, "3 more deliveries", func() bool { return calls.Load() == 6 })
	out, errOut, code = runCLI(t, s.Base, "replays", "get", id)
	if code != 0 || !strings.Contains(out, "replayed:") || !strings.Contains(out, "state:        completed") {
		t.Fatalf("replays get: %d %s %s", code, out, errOut)
	}

	for _, c := range []struct {
		args     []string
		code     int
		mentions string
	}{
		{[]string{"subscriptions", "replay", "hooks"}, 2, "--since"},
		{[]string{"subscriptions", "replay", "hooks", "--since", "soon"}, 2, "--since"},
		{[]string{"subscriptions", "replay", "hooks", "--since", "1h", "--states", "pending"}, 2, "--states"},
		{[]string{"subscriptions", "replay", "hooks", "--since", "1h", "--until", "2h"}, 1, "until"},
		{[]string{"subscriptions", "replay", "nope", "--since", "1h"}, 1, "nope"},
		{[]string{"replays", "get", "rpl_nope"}, 1, "rpl_nope"},
	} {
		out, errOut, code := runCLI(t, s.Base, c.args...)
		if code != c.code || !strings.Contains(errOut, c.mentions) {
			t.Errorf("%v: %d %q %q, want exit %d naming %q", c.args, code, out, errOut, c.code, c.mentions)
		}
	}
	if calls.Load() != 6 {
		t.Fatalf("%d deliveries, want 6", calls.Load())
	}
}
