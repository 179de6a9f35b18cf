package main_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostileAPI serves what the hostile poll sources of a review did: /page, a
// 61 MB page of valid items without a Content-Length, and /endless, an
// answer that never ends.
func hostileAPI(t *testing.T) *httptest.Server {
	t.Helper()
	var page bytes.Buffer
	page.WriteString(`{"events":[`)
	pad := strings.Repeat("p", 900)
	for i := 0; page.Len() < 61_000_000; i++ {
		if i > 0 {
			page.WriteByte(',')
		}
		fmt.Fprintf(&page, `{"id":"item-%07d","type":"hostile","pad":"%s"}`, i, pad)
	}
	page.WriteString(`]}`)
	body := page.Bytes()
	item := []byte(`{"id":"endless","type":"hostile","pad":"` + pad + `"},`)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/page":
			for rest := body; len(rest) > 0 && r.Context().Err() == nil; {
				n := min(len(rest), 1<<20)
				if _, err := w.Write(rest[:n]); err != nil {
					return
				}
				rest = rest[n:]
			}
		case "/endless":
			w.Write([]byte(`{"events":[`))
			for r.Context().Err() == nil {
				if _, err := w.Write(item); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

// peakRSS returns the peak resident set of a process in MiB (VmHWM).
func peakRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestPollRSS: serve with 18 hostile poll sources (9 polling a 61 MB page,
// 9 an endless answer, every 10 ms) for 20 s stays within 2 × the
// sources' budget (--source-buffer-bytes, 64 MiB by default) + 64 MiB of
// peak RSS, the ingress's target applied to this budget:
// what the sources read is at most the budget, an answer is cut at half of
// it, cut answers leave no garbage (pooled chunks), and the runtime's
// heap goal and the process's own memory fit in the rest (about 100 MiB
// is measured; BENCHMARKS.md). A review first measured 1.43 GB.
// POSTBOX_RSS_BINARY runs another binary (the main branch's, to measure
// "before"; it fails the bound).
func TestPollRSS(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/PID/status")
	}
	if testing.Short() {
		t.Skip("runs the real binary for 20 s")
	}
	bin := binary
	if b := os.Getenv("POSTBOX_RSS_BINARY"); b != "" {
		bin = b
	}
	api := hostileAPI(t)
	dir := t.TempDir()
	addr := freePort(t)
	srv := &proc{t: t, args: []string{"serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "error"}}
	srv.log = &bytes.Buffer{}
	srv.cmd = exec.Command(bin, srv.args...)
	srv.cmd.Stdout, srv.cmd.Stderr = srv.log, srv.log
	if err := srv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.kill)
	base := "http://" + addr
	waitHTTP(t, base+"/ready", srv)
	for i := range 18 {
		path := "/page"
		if i%2 == 1 {
			path = "/endless"
		}
		body := fmt.Sprintf(`{"name":"hostile%d","kind":"poll","settings":{"url":"%s%s?n=%d","items":"/events","id":"/id","type":"/type","interval":"10ms"}}`,
			i, api.URL, path, i)
		resp, err := http.Post(base+"/v1/sources", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("create source %d: %s", i, resp.Status)
		}
	}
	const budgetMiB = 64
	bound := 2*budgetMiB + 64.0
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if err := srv.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("serve exited (%v); its log:\n%s", err, srv.log)
		}
		<-time.After(500 * time.Millisecond)
	}
	rss := peakRSS(t, srv.cmd.Process.Pid)
	t.Logf("peak RSS %.0f MiB under 18 hostile poll sources (bound %.0f MiB)", rss, bound)
	if rss > bound {
		t.Errorf("peak RSS %.0f MiB, over the bound of %.0f MiB (2 × the %d MiB source budget + 64 MiB)", rss, bound, budgetMiB)
	}
}
