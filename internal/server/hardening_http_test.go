package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
)

// metric reads one sample of the server's metrics in-process (without a
// connection of its own, which a connection cap would count).
func metric(t *testing.T, ts *testServer, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "http://127.0.0.1/metrics", nil)
	ts.Srv.Handler().ServeHTTP(rec, req)
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, line)
			}
			return f
		}
	}
	t.Fatalf("no metric %s in %s", name, rec.Body)
	return 0
}

func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads c until the server closes it; it fails the test if
// c is still open after d (a generous bound: the server's own is far
// shorter).
func closedWithin(t *testing.T, c net.Conn, r io.Reader, d time.Duration, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, r)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: the connection was still open after %v", what, d)
	}
}

// TestSlowBodyIsCutOff: a client that sends a body a byte at a time is
// cut off once its body took longer than ReadTimeout, on the API (408)
// and on POST /webhooks alike.
func TestSlowBodyIsCutOff(t *testing.T) {
	ts := start(t, server.Config{ReadTimeout: 300 * time.Millisecond}, nil)
	for _, path := range []string{"/v1/subscriptions", "/webhooks"} {
		c := rawConn(t, ts.Addr)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nIdempotency-Key: slow\r\nContent-Length: 100000\r\n\r\n{", path)
		stop := make(chan struct{})
		go func() { // the sender's pace: a byte every 20ms, for 2,000 s
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		}()
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err == nil && resp.StatusCode != http.StatusRequestTimeout {
			t.Errorf("%s: a slow body answered %d, want 408", path, resp.StatusCode)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%s: the slow sender was still connected after 10s", path)
		}
		closedWithin(t, c, br, 10*time.Second, path)
		close(stop)
	}
}

// TestLongPollOutlivesReadTimeout: the body deadline ends with the body,
// so a lease that waits longer than ReadTimeout still answers.
func TestLongPollOutlivesReadTimeout(t *testing.T) {
	ts := start(t, server.Config{ReadTimeout: 100 * time.Millisecond}, nil)
	started := time.Now()
	status, body := call(t, ts, "POST", "/v1/inboxes/webhooks/lease", `{"wait":"1s"}`)
	if status != 200 {
		t.Fatalf("lease: %d %v", status, body)
	}
	if waited := time.Since(started); waited < time.Second {
		t.Fatalf("the lease answered after %v, before its wait of 1s ended: it was cut off", waited)
	}
}

// TestIdleKeepAliveIsClosed: a keep-alive connection that sends no
// further request is closed after IdleTimeout.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	ts := start(t, server.Config{IdleTimeout: 200 * time.Millisecond}, nil)
	c := rawConn(t, ts.Addr)
	fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: postbox\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("GET /health: %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
	}
	closedWithin(t, c, br, 10*time.Second, "an idle keep-alive")
}

// TestOversizedHeadersGet431: headers over MaxHeaderBytes (64 KiB by
// default) are refused before any handler runs.
func TestOversizedHeadersGet431(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	req, _ := http.NewRequest("GET", ts.Base+"/health", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 128<<10))
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("128 KiB of headers: %d, want 431", resp.StatusCode)
	}
	req.Header.Set("X-Big", strings.Repeat("a", 32<<10))
	if resp, err = ts.HTTP.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("32 KiB of headers: %d, want 200", resp.StatusCode)
	}
}

// TestConnectionCap: with MaxConnections open, connection N+1 is closed
// at once and counted; once one closes, a new one is served.
func TestConnectionCap(t *testing.T) {
	const max = 3
	ts := start(t, server.Config{MaxConnections: max, ReadTimeout: time.Minute}, nil)
	ts.HTTP.CloseIdleConnections() // the readiness probe's keep-alive
	waitFor(t, 10*time.Second, "no open connections", func() bool { return metric(t, ts, "postbox_http_connections") == 0 })
	held := make([]net.Conn, max)
	for i := range held {
		held[i] = rawConn(t, ts.Addr)
	}
	waitFor(t, 10*time.Second, "3 open connections", func() bool { return metric(t, ts, "postbox_http_connections") == max })
	extra := rawConn(t, ts.Addr)
	closedWithin(t, extra, extra, 5*time.Second, "connection N+1")
	waitFor(t, 10*time.Second, "a refused connection counted", func() bool {
		return metric(t, ts, "postbox_http_connections_refused_total") == 1
	})
	if open := metric(t, ts, "postbox_http_connections"); open != max {
		t.Fatalf("postbox_http_connections = %v after a refusal, want %d", open, max)
	}
	held[0].Close()
	waitFor(t, 10*time.Second, "a connection's place given back", func() bool { return metric(t, ts, "postbox_http_connections") == max-1 })
	resp, err := (&http.Client{}).Get(ts.Base + "/health")
	if err != nil {
		t.Fatalf("a connection once one closed: %v", err)
	}
	resp.Body.Close()
}

// TestMetricsFollowTheAPIToken: /metrics names subscriptions and inboxes,
// so it takes the API token when the server has one.
func TestMetricsFollowTheAPIToken(t *testing.T) {
	get := func(ts *testServer, auth string) int {
		req, _ := http.NewRequest("GET", ts.Base+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := ts.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := start(t, server.Config{APIToken: "op-token"}, nil)
	if status := get(tok, ""); status != 401 {
		t.Errorf("/metrics without the API token: %d, want 401", status)
	}
	if status := get(tok, "wrong"); status != 401 {
		t.Errorf("/metrics with a wrong token: %d, want 401", status)
	}
	if status := get(tok, "op-token"); status != 200 {
		t.Errorf("/metrics with the API token: %d, want 200", status)
	}
	open := start(t, server.Config{}, nil)
	if status := get(open, ""); status != 200 {
		t.Errorf("/metrics of a server without an API token: %d, want 200", status)
	}
}

// TestOpenOperatorAPIRefused: beyond loopback without an API token, Run
// refuses to start and names the flags; with the token, or the explicit
// opt-out, it serves.
func TestOpenOperatorAPIRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewDefault(server.Config{DBPath: filepath.Join(t.TempDir(), "p.db"), Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "Config.APIToken") || !strings.Contains(err.Error(), "Config.InsecureNoAPIToken") {
		t.Fatalf("Run on %s without an API token: %v, want a refusal naming Config.APIToken and Config.InsecureNoAPIToken", ln.Addr(), err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Errorf("the refused server still listens on %s", ln.Addr())
	}
	for _, cfg := range []server.Config{{APIToken: "op-token"}, {InsecureNoAPIToken: true}} {
		if cfg.Listener, err = net.Listen("tcp", "0.0.0.0:0"); err != nil {
			t.Fatal(err)
		}
		start(t, cfg, nil) // fails unless /ready answers
	}
}
