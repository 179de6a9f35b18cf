package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeRefusesAnOpenOperatorAPI: serve beyond loopback without an API
// token stops with a message naming the flags and their variables; the
// explicit opt-out (flag or variable) or a token lets it start.
func TestServeRefusesAnOpenOperatorAPI(t *testing.T) {
	dir := t.TempDir()
	// Without the refusal serve would run: the context ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve", "--addr", "0.0.0.0:0", "--db", filepath.Join(dir, "refused.db"))
	outb, err := cmd.CombinedOutput()
	out, code := string(outb), cmd.ProcessState.ExitCode()
	if ctx.Err() != nil {
		t.Fatalf("serve --addr 0.0.0.0:0 without a token was still running after 20s: %v %s", err, out)
	}
	for _, want := range []string{"beyond loopback", "--api-token", "POSTBOX_API_TOKEN", "--insecure-no-api-token", "POSTBOX_INSECURE_NO_API_TOKEN"} {
		if code == 0 || !strings.Contains(out, want) {
			t.Errorf("serve --addr 0.0.0.0:0 without a token: exit %d, output %q; want a refusal naming %s", code, out, want)
		}
	}
	bad := exec.Command(binary, "serve", "--addr", "0.0.0.0:0", "--db", filepath.Join(dir, "bad.db"))
	bad.Env = append(bad.Environ(), "POSTBOX_INSECURE_NO_API_TOKEN=perhaps")
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), `POSTBOX_INSECURE_NO_API_TOKEN="perhaps": want true or false`) {
		t.Errorf("POSTBOX_INSECURE_NO_API_TOKEN=perhaps: %v %s; want an error naming the variable and what it takes", err, out)
	}
	if out, err := exec.Command(binary, "serve", "--insecure-no-api-token=perhaps").CombinedOutput(); err == nil || !strings.Contains(string(out), "-insecure-no-api-token: want true or false") {
		t.Errorf("--insecure-no-api-token=perhaps: %v %s; want an error naming the flag and what it takes", err, out)
	}
	for i, c := range []struct {
		args []string
		env  string
	}{{[]string{"--insecure-no-api-token"}, ""}, {nil, "POSTBOX_INSECURE_NO_API_TOKEN=true"}, {[]string{"--api-token", "op-token"}, ""}} {
		ln, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		ln.Close()
		p := &proc{t: t, args: append([]string{"serve", "--addr", "0.0.0.0:" + port, "--db", filepath.Join(dir, fmt.Sprint(i, ".db")), "--log-level", "warn"}, c.args...)}
		p.log = &bytes.Buffer{}
		p.cmd = exec.Command(binary, p.args...)
		p.cmd.Env = append(p.cmd.Environ(), c.env)
		p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.kill)
		waitHTTP(t, "http://127.0.0.1:"+port+"/ready", p)
	}
}

// TestServeDefaultsToLoopback: serve with neither --addr nor --port (nor
// their variables) listens on 127.0.0.1:8000, so a first run needs no
// token; PORT alone means every interface, and so wants one.
func TestServeDefaultsToLoopback(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "serve", "--db", filepath.Join(dir, "default.db"))
	cmd.Env = append(cmd.Environ(), "PORT=", "POSTBOX_ADDR=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	// Either it listens there, or the port is taken by someone else and it
	// says so: both name the address it chose.
	var seen []string
	for sc := bufio.NewScanner(stderr); sc.Scan(); {
		line := sc.Text()
		seen = append(seen, line)
		if strings.Contains(line, "addr=127.0.0.1:8000") || strings.Contains(line, "listen 127.0.0.1:8000:") {
			break
		}
		if strings.Contains(line, "beyond loopback") || strings.Contains(line, "addr=[::]") || strings.Contains(line, "addr=0.0.0.0") {
			t.Fatalf("serve without an address: %s", line)
		}
	}
	if ctx.Err() != nil || !strings.Contains(strings.Join(seen, "\n"), "127.0.0.1:8000") {
		t.Fatalf("serve without an address never named 127.0.0.1:8000: %q", seen)
	}

	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	withPort := exec.Command(binary, "serve", "--db", filepath.Join(dir, "port.db"))
	withPort.Env = append(withPort.Environ(), "PORT="+port, "POSTBOX_ADDR=")
	if out, err := withPort.CombinedOutput(); err == nil || !strings.Contains(string(out), "beyond loopback") {
		t.Errorf("serve with PORT=%s and no token: %v %s; want a refusal: PORT listens on every interface", port, err, out)
	}
}
