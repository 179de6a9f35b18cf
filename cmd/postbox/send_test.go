package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSendPrintsAnswersWhenARequestFails: send --count 5000 --parallel 2
// to an agent that refuses its second request while the first is still in
// flight. The first's answer is not abandoned but printed (its 1,000 ids,
// which a caller must not send again), the refusal is named on stderr with
// the events it held, the requests after it are not sent, and send exits
// 1.
func TestSendPrintsAnswersWhenARequestFails(t *testing.T) {
	var arrived, next atomic.Int64
	refused := make(chan struct{})
	var once sync.Once
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var envs []map[string]any
		if err := json.NewDecoder(r.Body).Decode(&envs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if arrived.Add(1) == 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"unavailable","message":"the outbox could not store the events; nothing was queued: disk full"}}`))
			w.(http.Flusher).Flush()
			once.Do(func() { close(refused) })
			return
		}
		// The first answers only after the second was refused: send must
		// wait for it rather than give it up.
		select {
		case <-refused:
		case <-r.Context().Done():
			return
		case <-time.After(20 * time.Second):
		}
		out := make([]map[string]any, len(envs))
		for i := range out {
			out[i] = map[string]any{"event_id": fmt.Sprintf("evt_%d", next.Add(1)), "status": "queued"}
		}
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(map[string]any{"events": out})
	}))
	defer agent.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "send", "--agent", agent.URL, "--type", "t", "--payload", `{}`,
		"--count", "5000", "--parallel", "2", "--json")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var statuses []map[string]any
	if jerr := json.Unmarshal([]byte(stdout.String()), &statuses); jerr != nil || len(statuses) != 1000 {
		t.Fatalf("stdout holds %d answers (%v), want the first request's 1000:\n%.300s\nstderr:\n%s", len(statuses), jerr, stdout.String(), stderr.String())
	}
	for _, s := range statuses {
		if s["status"] != "queued" || !strings.HasPrefix(s["event_id"].(string), "evt_") {
			t.Fatalf("answer %v, want an event id queued", s)
		}
	}
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("send exited with %v, want exit status 1\nstderr:\n%s", err, stderr.String())
	}
	errs := stderr.String()
	// Either of the first two requests may reach the agent second.
	if !regexp.MustCompile(`request (1 of 5 \(events 1-1000\)|2 of 5 \(events 1001-2000\)) failed: the agent refused the events ` +
		`\(503 Service Unavailable, unavailable\): the outbox could not store the events; nothing was queued: disk full`).MatchString(errs) {
		t.Errorf("stderr does not name the refused request and why:\n%s", errs)
	}
	for _, want := range []string{
		"request 3 of 5 (events 2001-3000) was not sent",
		"request 5 of 5 (events 4001-5000) was not sent",
		"the agent answered for 1000 of 5000 events (printed above)",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errs)
		}
	}
	if n := arrived.Load(); n != 2 {
		t.Errorf("the agent got %d requests, want 2: none after the refusal", n)
	}
}
