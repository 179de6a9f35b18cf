package main_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestOneServePerDatabase: a second serve started on the database of a
// running one refuses to start, naming the database and the first's pid,
// and the first goes on storing webhooks (two writers once made every
// append of both fail on a UNIQUE constraint while both answered ready).
// A second agent, or a relay, on an agent's outbox is refused the same
// way.
func TestOneServePerDatabase(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "pb.db")
	addr := freePort(t)
	first := start(t, "serve", "--addr", addr, "--db", db)
	waitHTTP(t, "http://"+addr+"/ready", first)
	post := func(key string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/webhooks", strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("webhook %s: %s", key, resp.Status)
		}
	}
	post("before")
	// second runs a command that must refuse to start: its output, after
	// it exits non-zero. One that starts is killed after a while.
	second := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
		if ctx.Err() != nil || err == nil {
			t.Fatalf("postbox %s started beside the first (%v):\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	out := second("serve", "--addr", freePort(t), "--db", db)
	if pid := fmt.Sprintf("(pid %d)", first.cmd.Process.Pid); !strings.Contains(out, db+" is in use by another process "+pid) {
		t.Fatalf("second serve on %s:\n%s\nwant a refusal naming the database and %s", db, out, pid)
	}
	post("after")

	outbox := filepath.Join(dir, "outbox.db")
	listen := freePort(t)
	agent := start(t, "agent", "--server", "ws://"+addr, "--device-id", "d1", "--outbox", outbox, "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", agent)
	out = second("agent", "--server", "ws://"+addr, "--device-id", "d1", "--outbox", outbox, "--listen", freePort(t))
	if pid := fmt.Sprintf("(pid %d)", agent.cmd.Process.Pid); !strings.Contains(out, outbox+" is in use by another process "+pid) {
		t.Fatalf("second agent on %s:\n%s\nwant a refusal naming the outbox and %s", outbox, out, pid)
	}
	// Nor does a relay send the outbox an agent sends.
	out = second("relay", "--db", outbox, "--to", "ws://"+addr, "--listen", "")
	if pid := fmt.Sprintf("(pid %d)", agent.cmd.Process.Pid); !strings.Contains(out, outbox+" is in use by another process "+pid) {
		t.Fatalf("relay of an agent's outbox %s:\n%s\nwant a refusal naming the outbox and %s", outbox, out, pid)
	}
}

// TestOneServePerDatabaseFile: the lock is the database file's, not its
// name's. A second serve on a hard link of a running one's database, or
// on a symbolic link to it, refuses to start, naming the first's pid and
// the name it runs on (two servers on two hard links of one file both
// answered ready, and the file ended malformed, acknowledged webhooks
// lost).
func TestOneServePerDatabaseFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the database file itself is locked on Linux only")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "a", "pb.db")
	addr := freePort(t)
	first := start(t, "serve", "--addr", addr, "--db", db)
	waitHTTP(t, "http://"+addr+"/ready", first)
	hard := filepath.Join(dir, "b", "pb.db")
	os.MkdirAll(filepath.Dir(hard), 0o755)
	if err := os.Link(db, hard); err != nil {
		t.Fatal(err)
	}
	soft := filepath.Join(dir, "soft.db")
	if err := os.Symlink(db, soft); err != nil {
		t.Fatal(err)
	}
	// refused runs a command that must exit 1 saying want; one that
	// starts is killed after a while.
	refused := func(want string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
		var ee *exec.ExitError
		if ctx.Err() != nil || !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), want) {
			t.Fatalf("postbox %s: %v (killed after 15 s: %v)\n%s\nwant exit 1 saying %q", strings.Join(args, " "), err, ctx.Err() != nil, out, want)
		}
	}
	for _, name := range []string{hard, soft} {
		refused(fmt.Sprintf("%s is in use by another process (pid %d, as %s)", name, first.cmd.Process.Pid, db),
			"serve", "--addr", freePort(t), "--db", name)
	}
	if resp, err := http.Get("http://" + addr + "/ready"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the first after the refusals: %v %v", resp, err)
	}

	// The same for an agent's outbox: a relay of a hard link of it is
	// refused before it opens the file.
	outbox := filepath.Join(dir, "a", "outbox.db")
	listen := freePort(t)
	agent := start(t, "agent", "--server", "ws://"+addr, "--device-id", "d1", "--outbox", outbox, "--listen", listen)
	waitHTTP(t, "http://"+listen+"/health", agent)
	linked := filepath.Join(dir, "b", "outbox.db")
	if err := os.Link(outbox, linked); err != nil {
		t.Fatal(err)
	}
	refused(fmt.Sprintf("%s is in use by another process (pid %d, as %s)", linked, agent.cmd.Process.Pid, outbox),
		"relay", "--db", linked, "--to", "ws://"+addr, "--listen", "")
}
