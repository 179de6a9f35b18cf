package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/buildinfo"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// run runs the binary and returns its combined output and exit code.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatal(err)
	return "", -1
}

func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"serve", "--help"}, {"agent", "--help"}, {"send", "--help"},
		{"outbox", "--help"}, {"outbox", "list", "--help"}, {"outbox", "requeue", "--help"}, {"bench", "--help"}, {"bench", "webhooks", "--help"},
		{"dlq", "--help"}, {"dlq", "list", "--help"}, {"dlq", "replay", "--help"},
		{"relay", "--help"}, {"outbox", "emit", "--help"}, {"outbox", "migrate", "--help"},
	} {
		out, code := run(t, args...)
		if code != 0 || !strings.Contains(out, "Usage: postbox") {
			t.Errorf("postbox %s: exit %d, output:\n%s", strings.Join(args, " "), code, out)
		}
	}
}

func TestBadInvocations(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"subscription"}, 2, `unknown command "subscription" (did you mean subscriptions?)`},
		{[]string{"replay"}, 2, `(did you mean replays?)`},
		{[]string{"serve", "--max-batch", "0"}, 2, "max-batch"},
		{[]string{"serve", "--log-format", "xml"}, 2, "log-format"},
		{[]string{"serve", "--retry-jitter", "some"}, 2, "use full, equal, none"},
		{[]string{"serve", "--retry-base-delay", "10m", "--retry-max-delay", "1m"}, 2, "above the retry max delay"},
		{[]string{"serve", "--webhook-target", "localhost:9000"}, 2, "not an http:// or https:// URL"},
		{[]string{"agent", "--outbox", filepath.Join(dir, "o.db")}, 2, "--server and --device-id are required"},
		{[]string{"send", "--type", "t", "--payload", "[1]"}, 2, "--payload must be a JSON object"},
		{[]string{"send", "--type", "t", "--payload", "{}", "--agent", "http://127.0.0.1:1"}, 1, "is the agent running?"},
		{[]string{"outbox", "list", "--outbox", filepath.Join(dir, "missing.db")}, 1, "no such file"},
		{[]string{"outbox", "list"}, 1, "no outbox.db here, the default of --outbox"}, // run from the package's directory, which has none
		{[]string{"outbox", "list", "--state", "odd", "--outbox", "x"}, 2, "--state must be"},
		{[]string{"outbox", "requeue", "--outbox", "x"}, 2, "name event ids or pass --all"},
		{[]string{"bench", "extra"}, 2, `takes no arguments, got ["extra"]`},
		{[]string{"bench", "webhooks", "extra"}, 2, `takes no arguments, got ["extra"]`},
		{[]string{"bench", "--payload-bytes", "999999999999"}, 2, "want a size in bytes from 1 to 1048576"},
		{[]string{"bench", "agent", "--payload-bytes", "0"}, 2, "want a size in bytes from 1 to 1048576"},
	} {
		out, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("postbox %s: exit %d (want %d), output %q (want it to contain %q)", strings.Join(tc.args, " "), code, tc.code, out, tc.want)
		}
	}
}

// TestEnvironmentErrorNamesVariable: each of serve's variables with a
// bad value stops serve with a message naming it; a flag wins over its
// variable.
func TestEnvironmentErrorNamesVariable(t *testing.T) {
	for _, env := range []string{"QUEUE_MAXSIZE=lots", "WORKER_COUNT=0", "MAX_ATTEMPTS=-1", "RETRY_BASE_DELAY=soon",
		"RETRY_MAX_DELAY=5x", "RETENTION_DAYS=-3", "CLEANUP_INTERVAL_HOURS=never", "LOG_LEVEL=loud", "LOG_FORMAT=xml",
		"POSTBOX_RETRY_JITTER=lots", "PORT=http", "WEBHOOK_TARGET_URL=ftp://x"} {
		cmd := exec.Command(binary, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "p.db"))
		cmd.Env = append(cmd.Environ(), env)
		out, err := cmd.CombinedOutput()
		name, _, _ := strings.Cut(env, "=")
		if err == nil || !strings.Contains(string(out), "environment variable "+name) {
			t.Errorf("%s: want a startup error naming %s, got %v: %s", env, name, err, out)
		}
	}
	cmd := exec.Command(binary, "serve", "--max-attempts", "3", "--retry-base-delay", "10m", "--db", filepath.Join(t.TempDir(), "p.db"))
	cmd.Env = append(cmd.Environ(), "MAX_ATTEMPTS=bad", "RETRY_MAX_DELAY=1m")
	if out, _ := cmd.CombinedOutput(); !strings.Contains(string(out), "above the retry max delay 1m0s") {
		t.Errorf("--max-attempts should win over MAX_ATTEMPTS, and RETRY_MAX_DELAY apply: %s", out)
	}
}

func TestBenchJSONLastLine(t *testing.T) {
	cmd := exec.Command(binary, "bench", "--devices", "4", "--events", "4000", "--json")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("last line is not JSON: %q", lines[len(lines)-1])
	}
	for _, k := range []string{"events", "acked", "stored", "duration_s", "events_per_s", "ack_p50_ms", "ack_p99_ms"} {
		if _, ok := res[k]; !ok {
			t.Errorf("result lacks %q: %v", k, res)
		}
	}
	if res["events"] != 4000.0 || res["acked"] != 4000.0 || res["stored"] != 4000.0 {
		t.Errorf("want 4000 events acked and stored once, got %v", res)
	}
}

// TestOutboxListAndRequeue: an operator sees a rejected row with the
// server's reason and sends it again.
func TestOutboxListAndRequeue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	store, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { store.Run(ctx); close(done) }()
	env := postbox.Envelope{SchemaVersion: 1, EventID: "evt_rejected_1", Type: "t", TS: "2026-01-01T00:00:00Z",
		SessionID: "s", DeviceID: "pi-01", Payload: json.RawMessage(`{"big":true}`)}
	if _, err := store.Insert(ctx, []postbox.Envelope{env}); err != nil {
		t.Fatal(err)
	}
	if err := store.Settle(ctx, []outbox.Outcome{{EventID: env.EventID, Kind: outbox.Rejected, Error: "too_large: envelope is 300000 bytes"}}); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	store.Close()

	out, code := run(t, "outbox", "list", "--outbox", path, "--json")
	var rows []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 ||
		rows[0]["event_id"] != env.EventID || rows[0]["state"] != "rejected" || !strings.Contains(rows[0]["last_error"].(string), "too_large") {
		t.Fatalf("outbox list: exit %d, %s", code, out)
	}
	if out, code := run(t, "outbox", "list", "--outbox", path); code != 0 || !strings.Contains(out, "too_large") {
		t.Fatalf("outbox list (table): exit %d, %s", code, out)
	}
	if out, code := run(t, "outbox", "requeue", env.EventID, "evt_nope", "--outbox", path); code != 0 || !strings.Contains(out, "1 rejected events requeued") ||
		!strings.Contains(out, "1 of the 2 ids named are not rejected rows") {
		t.Fatalf("outbox requeue: exit %d, %s", code, out)
	}
	out, _ = run(t, "outbox", "list", "--outbox", path, "--state", "pending", "--json")
	if !strings.Contains(out, env.EventID) {
		t.Fatalf("after requeue the row is not pending: %s", out)
	}
	if out, code := run(t, "outbox", "requeue", "evt_nope", "--outbox", path); code != 1 || !strings.Contains(out, "none of") {
		t.Fatalf("requeue of an unknown id: exit %d, %s", code, out)
	}
}

// TestSendThroughAgentToServer runs the commands of the Quick start's
// "Try it": serve, agent, send; every event sent is stored once.
func TestSendThroughAgentToServer(t *testing.T) {
	dir := t.TempDir()
	addr, listen := freePort(t), freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)
	a := start(t, "agent", "--server", "ws://"+addr, "--outbox", filepath.Join(dir, "outbox.db"), "--device-id", "pi-01", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", a)

	out, code := run(t, "send", "--agent", "http://"+listen, "--type", "proposal.task", "--payload", `{"intent":"x"}`)
	if code != 0 || !strings.HasPrefix(out, "evt_") || !strings.Contains(out, "queued") {
		t.Fatalf("send: exit %d, %s", code, out)
	}
	out, code = run(t, "send", "--agent", "http://"+listen, "--type", "proposal.task", "--payload", `{"intent":"y"}`, "--count", "2500")
	if code != 0 || !strings.Contains(out, "2500 events queued") {
		t.Fatalf("send --count: exit %d, %s", code, out)
	}
	drained(t, map[string]*proc{"http://" + listen: a})
	srv.kill()
	db, err := sqlitedb.Open(filepath.Join(dir, "postbox.db"), sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT source_native_id) FROM stream_events WHERE stream_id = 'devices'`).Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != 2501 || distinct != 2501 {
		t.Fatalf("stored %d events (%d distinct), want 2501", n, distinct)
	}
}

// TestAuthTokensFile: a malformed tokens file stops serve with the line at
// fault; a good one makes the ingress require a token, which the agent
// sends with --token, and which a relay with a wrong one is refused at
// its start.
func TestAuthTokensFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	os.WriteFile(bad, []byte("# tokens\nsecret-1 pi-01\nonly-a-token\n"), 0o600)
	if out, code := run(t, "serve", "--auth-tokens", bad, "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "x.db")); code != 1 || !strings.Contains(out, "bad.txt:3") {
		t.Fatalf("bad tokens file: exit %d, %s", code, out)
	}
	good := filepath.Join(dir, "tokens.txt")
	os.WriteFile(good, []byte("secret-1 pi-01\n"), 0o600)
	addr, listen := freePort(t), freePort(t)
	srv := start(t, "serve", "--auth-tokens", good, "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)
	if resp, err := http.Get("http://" + addr + "/v1/ws"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("ingress without a token: %v %v, want 401", resp, err)
	}
	// A relay to it with a wrong token stops at the start, as it does
	// for a target of another kind that refuses it.
	if out, code := run(t, "relay", "--db", filepath.Join(dir, "relay.db"), "--to", "ws://"+addr, "--token", "wrong", "--listen", ""); code != 1 || !strings.Contains(out, "401 unauthorized") ||
		!strings.Contains(out, "the server refused the token given with --token") {
		t.Fatalf("relay with a wrong token: exit %d, %s; want 1, the server's 401 and that it refused the token", code, out)
	}
	if out, code := run(t, "relay", "--db", filepath.Join(dir, "relay.db"), "--to", "ws://"+addr, "--listen", ""); code != 1 || !strings.Contains(out, "the server needs a token: give it with --token") {
		t.Fatalf("relay without a token: exit %d, %s; want 1 and that the server needs one", code, out)
	}
	a := start(t, "agent", "--server", "ws://"+addr, "--token", "secret-1", "--outbox", filepath.Join(dir, "outbox.db"), "--device-id", "pi-01", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", a)
	if out, code := run(t, "send", "--agent", "http://"+listen, "--type", "t", "--payload", `{}`, "--count", "10"); code != 0 {
		t.Fatalf("send: %s", out)
	}
	drained(t, map[string]*proc{"http://" + listen: a})
}

// TestVersion: postbox version and postbox --version say which postbox
// this is; --json gives the same as an object.
func TestVersion(t *testing.T) {
	out, code := run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "postbox ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("postbox version: exit %d: %q", code, out)
	}
	if again, code := run(t, "--version"); code != 0 || again != out {
		t.Errorf("postbox --version: exit %d: %q, want %q", code, again, out)
	}
	js, code := run(t, "version", "--json")
	var m map[string]string
	if code != 0 || json.Unmarshal([]byte(js), &m) != nil || m["version"] == "" || m["go_version"] != runtime.Version() {
		t.Errorf("postbox version --json: exit %d: %q", code, js)
	}
	// The binary is built from this checkout: git stamps its commit.
	if m["commit"] != "" && !strings.Contains(out, m["commit"]) {
		t.Errorf("postbox version %q does not name the commit %q", out, m["commit"])
	}
}

// TestVersionIsTheSources: the binary says the version the source
// declares (buildinfo.Version, not "devel"), and the commit git has
// checked out when the build stamped one.
func TestVersionIsTheSources(t *testing.T) {
	js, code := run(t, "version", "--json")
	var m map[string]string
	if code != 0 || json.Unmarshal([]byte(js), &m) != nil || m["version"] != buildinfo.Version {
		t.Fatalf("postbox version --json: exit %d: %q, want version %q", code, js, buildinfo.Version)
	}
	if out, _ := run(t, "version"); !strings.HasPrefix(out, "postbox "+buildinfo.Version+" ") {
		t.Errorf("postbox version: %q, want it to start with %q", out, "postbox "+buildinfo.Version+" ")
	}
	// A build without VCS stamping (-buildvcs=false, no git) has no
	// commit; one with it names HEAD.
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil || m["commit"] == "" {
		t.Logf("commit %q (git: %v): not compared", m["commit"], err)
		return
	}
	if want := strings.TrimSpace(string(head)); !strings.HasPrefix(m["commit"], want) || m["build_time"] == "" {
		t.Errorf("postbox version --json: commit %q, build_time %q: want commit %s and its time", m["commit"], m["build_time"], want)
	}
}
