package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox/internal/testenv"
)

// TestFloodRSS floods postbox serve with 20 WebSocket connections of
// large frames, as the review that found the process at 805 MB under a
// 128 MiB --ws-buffer-bytes did, and reads the process's peak RSS: it must
// stay within twice the ingress budget and 64 MB, and the process must be
// back under 100 MB within 30 s of the flood's end. In CI it runs at a
// quarter of the size (a 32 MiB budget, 3.75 MB frames, a proportional
// --queue-bytes); POSTBOX_TEST_FLOOD_FULL=1 runs it at the review's size
// (128 MiB, 15 MB frames). POSTBOX_TEST_FLOOD_BINARY runs another postbox
// binary (the one before a change, to see the test fail).
func TestFloodRSS(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the peak RSS from /proc/PID/status (Linux only)")
	}
	budget, frames := int64(32<<20), 2
	if os.Getenv("POSTBOX_TEST_FLOOD_FULL") != "" {
		budget, frames = 128<<20, 3
	}
	frameBytes := int(15e6 * budget / (128 << 20)) // 15 MB at 128 MiB
	bin := binary
	if b := os.Getenv("POSTBOX_TEST_FLOOD_BINARY"); b != "" {
		bin = b
	}
	for _, tc := range []struct {
		name string
		// payload is the size of each envelope's payload: under the
		// 256 KiB limit they are stored, over it each is refused.
		payload int
	}{
		{name: "stored", payload: 200 << 10},
		{name: "refused", payload: 300 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freePort(t)
			p := &proc{t: t, bin: bin, args: []string{"serve", "--addr", addr, "--db", t.TempDir() + "/pb.db", "--synchronous", "normal",
				"--ws-buffer-bytes", strconv.FormatInt(budget, 10), "--queue-bytes", strconv.FormatInt(budget/2, 10),
				"--source-buffer-bytes", "1048576"}} // no sources here: the memory limit is the ingress's and the queue's
			p.restart()
			t.Cleanup(p.kill)
			waitHTTP(t, "http://"+addr+"/ready", p)
			pid := p.cmd.Process.Pid

			n := max(1, frameBytes/(tc.payload+256))
			start := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, 20)
			answers := make([]int, 20)
			for c := range 20 {
				wg.Go(func() {
					got, err := floodConn(addr, c, frames, n, tc.payload)
					answers[c] = got
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("flood: %v; server log:\n%s", err, p.log)
				}
			}
			took := time.Since(start)
			for c, got := range answers {
				if got != frames*n {
					t.Fatalf("connection %d got %d answers, want %d", c, got, frames*n)
				}
			}
			peak := procStatus(t, pid, "VmHWM")
			limit := 2*budget + 64e6
			t.Logf("%d × %d frames of %d envelopes of %d KiB in %v: peak RSS %d MB (limit %d MB)",
				20, frames, n, tc.payload>>10, took.Round(time.Millisecond), peak/1e6, limit/1e6)
			if peak > limit {
				t.Errorf("peak RSS %d MB, over 2 × the %d MiB ingress budget + 64 MB = %d MB", peak/1e6, budget>>20, limit/1e6)
			}
			ended := time.Now()
			var rss int64
			for {
				rss = procStatus(t, pid, "VmRSS")
				if rss < 100e6 {
					t.Logf("RSS %d MB %v after the flood", rss/1e6, time.Since(ended).Round(100*time.Millisecond))
					break
				}
				if time.Since(ended) > 30*time.Second {
					t.Errorf("RSS still %d MB 30s after the flood, want under 100 MB", rss/1e6)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// floodConn sends frames frames of n envelopes with payloads of payload
// bytes on one connection, each frame whole before reading its answers,
// and returns how many envelopes were answered.
func floodConn(addr string, conn, frames, n, payload int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", &websocket.DialOptions{Subprotocols: []string{"postbox.v1"}})
	if err != nil {
		return 0, err
	}
	defer c.CloseNow()
	c.SetReadLimit(-1)
	pad := strings.Repeat("x", payload)
	answered := 0
	var frame bytes.Buffer
	for f := range frames {
		frame.Reset()
		frame.WriteByte('[')
		for i := range n {
			if i > 0 {
				frame.WriteByte(',')
			}
			fmt.Fprintf(&frame, `{"schema_version":1,"event_id":"evt_%d_%d_%d","type":"flood","ts":"2026-01-01T00:00:00Z",`+
				`"session_id":"s","device_id":"dev-%d","payload":{"pad":"%s"}}`, conn, f, i, conn, pad)
		}
		frame.WriteByte(']')
		if err := c.Write(ctx, websocket.MessageText, frame.Bytes()); err != nil {
			return answered, fmt.Errorf("write frame %d: %w", f, err)
		}
		for want := answered + n; answered < want; {
			_, data, err := c.Read(ctx)
			if err != nil {
				return answered, fmt.Errorf("read the answers of frame %d: %w", f, err)
			}
			answered += max(1, bytes.Count(data, []byte(`"event_id"`)))
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
	return answered, nil
}

// procStatus reads a size field (VmRSS, VmHWM) of /proc/PID/status, in
// bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestServeMemoryLimit: serve sets the Go runtime's soft memory limit from
// its budgets unless --memory-limit, POSTBOX_MEMORY_LIMIT or GOMEMLIMIT
// says otherwise, and logs it with where it came from.
func TestServeMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{want: `limit=288MiB from="default: --ws-buffer-bytes + --queue-bytes + --source-buffer-bytes + 32 MiB"`},
		{args: []string{"--ws-buffer-bytes", "33554432", "--queue-bytes", "16777216", "--source-buffer-bytes", "8388608"}, want: "limit=88MiB"},
		{env: []string{"GOMEMLIMIT=300MiB"}, want: "limit=300MiB from=GOMEMLIMIT"},
		{env: []string{"GOMEMLIMIT=300MiB"}, args: []string{"--memory-limit", "1GiB"}, want: "limit=1GiB from=--memory-limit"},
		{env: []string{"POSTBOX_MEMORY_LIMIT=off"}, want: `msg="postbox serve: no memory limit" from=POSTBOX_MEMORY_LIMIT`},
	} {
		args := append([]string{"serve", "--addr", freePort(t), "--db", t.TempDir() + "/pb.db", "--log-format", "text"}, tc.args...)
		cmd := exec.Command(binary, args...)
		cmd.Env = append(os.Environ(), tc.env...)
		var out testenv.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		found := false
		for deadline := time.Now().Add(20 * time.Second); !found && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			found = strings.Contains(out.String(), "memory limit")
		}
		cmd.Process.Kill()
		cmd.Wait()
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("serve %v with %v: want %q in its log:\n%s", tc.args, tc.env, tc.want, out.String())
		}
	}
	out, err := exec.Command(binary, "serve", "--memory-limit", "12XB").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"12XB" is not a memory limit`) {
		t.Errorf("serve --memory-limit 12XB: %v, %s; want a usage error naming the value", err, out)
	}
}
