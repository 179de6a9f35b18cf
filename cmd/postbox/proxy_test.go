package main_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// proxyConf is the nginx configuration docs/PROXY.md documents.
const proxyConf = "../../deploy/nginx/postbox.conf"

// TestNginxProxy runs nginx with deploy/nginx/postbox.conf (its
// addresses and certificate paths replaced) in front of a real postbox
// serve --trusted-proxies, and checks what docs/PROXY.md says of it: TLS
// with the certificate given; a webhook through the proxy is stored with
// the address nginx saw, not the X-Forwarded-For its sender made up, and
// one sent to postbox directly with a made-up header keeps its own
// address; a body over postbox's limit gets postbox's JSON 413 and one over
// nginx's is stopped there; a source's 429 and Retry-After pass through;
// the WebSocket ingress works through it. nginx reaches postbox from
// 127.0.0.2 (proxy_bind, added here), the one address trusted, so that the
// test's own requests, from 127.0.0.1, are a client's. Without nginx on
// PATH the test skips (fails under POSTBOX_REQUIRE_SERVICES=1).
func TestNginxProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary and nginx")
	}
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		testenv.Skip(t, "nginx is not on PATH, so the proxy configuration deploy/nginx/postbox.conf is not tested (apt-get install nginx)")
	}
	dir := t.TempDir()
	certPath, keyPath, cert := servertest.SelfSignedCert(t, dir)

	// postbox, trusting the proxy's address alone.
	addr := freePort(t)
	log := &testenv.Buffer{}
	srv := exec.Command(binary, "serve", "--addr", addr, "--db", filepath.Join(dir, "pb.db"), "--trusted-proxies", "127.0.0.2",
		"--log-level", "debug", "--log-format", "json")
	srv.Stdout, srv.Stderr = log, log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Signal(syscall.SIGKILL); srv.Wait() })
	direct := "http://" + addr
	testenv.Eventually(t, time.Minute, "postbox to be ready", func() bool {
		resp, err := http.Get(direct + "/ready")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})

	// nginx with the documented configuration.
	b, err := os.ReadFile(proxyConf)
	if err != nil {
		t.Fatal(err)
	}
	listen := freePort(t)
	conf := string(b)
	for _, r := range [][2]string{
		{"server 127.0.0.1:8000;", "server " + addr + ";"},
		{"listen 443 ssl;", "listen " + listen + " ssl;"},
		{"/etc/postbox/tls/fullchain.pem", certPath},
		{"/etc/postbox/tls/privkey.pem", keyPath},
		{"proxy_pass http://postbox;", "proxy_pass http://postbox;\n        proxy_bind 127.0.0.2;"},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("%s no longer holds %q: update this test with it", proxyConf, r[0])
		}
		conf = strings.Replace(conf, r[0], r[1], 1)
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the workers read the test's temporary files
	}
	main := fmt.Sprintf(`%s
daemon off;
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
events { worker_connections 256; }
http {
    access_log %[2]s/access.log;
    client_body_temp_path %[2]s/body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
    include %[2]s/postbox.conf;
}
`, user, dir)
	for name, text := range map[string]string{"postbox.conf": conf, "nginx.conf": main} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ngx := exec.Command(nginx, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "nginx.conf"))
	var ngxOut bytes.Buffer
	ngx.Stdout, ngx.Stderr = &ngxOut, &ngxOut
	if err := ngx.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ngx.Process.Signal(syscall.SIGQUIT); ngx.Wait() })
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	proxied := "https://" + listen
	testenv.Eventually(t, 30*time.Second, "nginx to answer over TLS", func() bool {
		resp, err := hc.Get(proxied + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	if t.Failed() {
		errLog, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Fatalf("nginx: %s\n%s", ngxOut.String(), errLog)
	}

	// TLS: the certificate is the one configured, and plain HTTP is not served.
	if resp, err := http.Get("http://" + listen + "/health"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered 200 on the TLS port")
		}
	}

	send := func(base, id string, header http.Header, body []byte) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", base, bytes.NewReader(body))
		req.Header = header.Clone()
		if req.Header == nil {
			req.Header = http.Header{}
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Request-Id", id)
		req.Header.Set("Idempotency-Key", id)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp, got
	}
	spoof := http.Header{"X-Forwarded-For": {"6.6.6.6"}}
	if resp, body := send(proxied+"/webhooks", "via-proxy", spoof, []byte(`{"a":1}`)); resp.StatusCode != 202 {
		t.Fatalf("webhook through nginx: %d %s", resp.StatusCode, body)
	}
	if resp, body := send(direct+"/webhooks", "direct", spoof, []byte(`{"a":2}`)); resp.StatusCode != 202 {
		t.Fatalf("webhook to postbox: %d %s", resp.StatusCode, body)
	}
	remote := func(id string) string {
		var addr string
		testenv.Eventually(t, 10*time.Second, "the request log of "+id, func() bool {
			sc := bufio.NewScanner(strings.NewReader(log.String()))
			for sc.Scan() {
				var line struct {
					Msg        string `json:"msg"`
					RequestID  string `json:"request_id"`
					RemoteAddr string `json:"remote_addr"`
				}
				if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "http request" && line.RequestID == id {
					addr = line.RemoteAddr
					return true
				}
			}
			return false
		})
		return addr
	}
	if got := remote("via-proxy"); got != "127.0.0.1:0" {
		t.Errorf("through nginx postbox saw the client as %q, want 127.0.0.1:0 (the address nginx saw, not the made-up 6.6.6.6)", got)
	}
	if got := remote("direct"); !strings.HasPrefix(got, "127.0.0.1:") || got == "127.0.0.1:0" {
		t.Errorf("sent directly with a made-up X-Forwarded-For postbox saw %q, want the connection's own 127.0.0.1:PORT", got)
	}

	// Bodies: over postbox's 1 MiB its JSON 413; over nginx's 2m, nginx's.
	resp, body := send(proxied+"/webhooks", "big", nil, append(append([]byte(`{"pad":"`), bytes.Repeat([]byte("x"), 1536<<10)...), `"}`...))
	if resp.StatusCode != 413 || !strings.Contains(string(body), `"too_large"`) {
		t.Errorf("a 1.5 MiB webhook through nginx: %d %.200s, want postbox's 413 too_large", resp.StatusCode, body)
	}
	resp, body = send(proxied+"/webhooks", "huge", nil, bytes.Repeat([]byte("x"), 3<<20))
	if resp.StatusCode != 413 || strings.Contains(string(body), `"too_large"`) || !strings.Contains(string(body), "nginx") {
		t.Errorf("a 3 MiB webhook through nginx: %d %.200s, want nginx's own 413", resp.StatusCode, body)
	}

	// A source's rate limit answers through the proxy, Retry-After and all.
	if out, errOut, code := runCLI(t, direct, "sources", "create", "slow", "--rate-limit", "1", "--rate-burst", "1"); code != 0 {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	if resp, body := send(proxied+"/webhooks/slow", "slow-1", nil, []byte(`{}`)); resp.StatusCode != 202 {
		t.Fatalf("first webhook of a 1/s source: %d %s", resp.StatusCode, body)
	}
	resp, body = send(proxied+"/webhooks/slow", "slow-2", nil, []byte(`{}`))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"rate_limited"`) {
		t.Errorf("second webhook of a 1/s source through nginx: %d Retry-After %q %s, want 429 rate_limited with Retry-After 1",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	// The WebSocket ingress through the proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "wss://"+listen+"/v1/ws", &websocket.DialOptions{Subprotocols: []string{"postbox.v1"}, HTTPClient: hc})
	if err != nil {
		t.Fatalf("WebSocket through nginx: %v", err)
	}
	defer c.CloseNow()
	env := `[{"schema_version":1,"event_id":"e1","type":"t","ts":"2026-01-01T00:00:00Z","session_id":"s","device_id":"d","payload":{}}]`
	if err := c.Write(ctx, websocket.MessageText, []byte(env)); err != nil {
		t.Fatal(err)
	}
	_, ack, err := c.Read(ctx)
	if err != nil || !bytes.Contains(ack, []byte(`"stored"`)) {
		t.Fatalf("the WebSocket's answer through nginx: %v %s", err, ack)
	}
	c.Close(websocket.StatusNormalClosure, "")
}
