package server_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
)

// TestBrowserGuard: what a web page can send to a server on the operator's
// loopback. A page of another origin changes nothing (403), a body a page
// can send without asking first (text/plain, a form) is refused (415),
// and a page that rebinds its DNS name to the server reads nothing (421).
// Intake (webhooks, probes) stays open to any host and origin, and the
// console, curl and the CLI, same-origin or without Origin, pass.
func TestBrowserGuard(t *testing.T) {
	for _, token := range []string{"", "s3cret"} {
		name := "no token"
		if token != "" {
			name = "token"
		}
		t.Run(name, func(t *testing.T) { testBrowserGuard(t, token) })
	}
}

func testBrowserGuard(t *testing.T, token string) {
	ts := start(t, server.Config{APIToken: token, AllowedHosts: []string{"postbox.internal", ".ops.example"},
		AllowedOrigins: []string{"https://console.ops.example"}}, nil)
	own := "http://" + ts.Addr
	sub := func(name string) string {
		return `{"name":"` + name + `","source":"webhooks","target":"http://127.0.0.1:9/"}`
	}
	for _, c := range []struct {
		name, method, path, host, body string
		header                         map[string]string
		status                         int
		code                           string
	}{
		// CSRF: a no-cors fetch or a form of another page.
		{"text/plain body", "POST", "/v1/subscriptions", "", sub("a"), map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"form body", "POST", "/v1/subscriptions", "", "name=a", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"},
		{"no content type", "POST", "/v1/subscriptions", "", sub("a"), nil, 415, "unsupported_media_type"},
		{"other origin", "POST", "/v1/subscriptions", "", sub("a"), map[string]string{"Origin": "http://evil.example:8080"}, 403, "cross_origin"},
		{"null origin", "POST", "/v1/subscriptions", "", sub("a"), map[string]string{"Origin": "null"}, 403, "cross_origin"},
		{"cross-site fetch", "POST", "/v1/subscriptions", "", sub("a"), map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "cross_origin"},
		{"another port of the host", "POST", "/v1/subscriptions", "", sub("a"), map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}, 403, "cross_origin"},
		{"delete from another origin", "DELETE", "/v1/subscriptions/a", "", "", map[string]string{"Origin": "http://evil.example"}, 403, "cross_origin"},
		{"replay from another origin", "POST", "/v1/dead-letters/replay", "", `{"all":true}`, map[string]string{"Origin": "http://evil.example", "Content-Type": "text/plain"}, 403, "cross_origin"},
		// DNS rebinding: the page's own name, pointed at 127.0.0.1.
		{"rebound read", "GET", "/v1/subscriptions", "evil.example:8000", "", nil, 421, "host_not_allowed"},
		{"rebound write", "POST", "/v1/subscriptions", "evil.example", sub("a"), map[string]string{"Origin": "http://evil.example"}, 421, "host_not_allowed"},
		{"rebound metrics", "GET", "/metrics", "evil.example", "", nil, 421, "host_not_allowed"},
		{"rebound console", "GET", "/ui/", "evil.example", "", nil, 421, "host_not_allowed"},
		{"suffix is not a subdomain", "GET", "/v1/subscriptions", "evilops.example", "", nil, 421, "host_not_allowed"},
		// What passes.
		{"the console", "POST", "/v1/subscriptions", "", sub("b"), map[string]string{"Content-Type": "application/json", "Origin": own, "Sec-Fetch-Site": "same-origin"}, 201, ""},
		{"an allowed origin", "POST", "/v1/subscriptions", "", sub("c"), map[string]string{"Content-Type": "application/json; charset=utf-8", "Origin": "https://console.ops.example", "Sec-Fetch-Site": "cross-site"}, 201, ""},
		{"curl", "POST", "/v1/subscriptions", "", sub("d"), map[string]string{"Content-Type": "application/json"}, 201, ""},
		{"no body, no type", "POST", "/v1/subscriptions/d/enable", "", "", nil, 200, ""},
		{"localhost", "GET", "/v1/subscriptions", "localhost", "", nil, 200, ""},
		{"a localhost name", "GET", "/v1/subscriptions", "postbox.localhost:8000", "", nil, 200, ""},
		{"an IPv6 address", "GET", "/v1/subscriptions", "[::1]:8000", "", nil, 200, ""},
		{"an allowed host", "GET", "/v1/subscriptions", "POSTBOX.internal.:8000", "", nil, 200, ""},
		{"an allowed domain", "GET", "/metrics", "a.ops.example", "", nil, 200, ""},
		{"a webhook from anywhere", "POST", "/webhooks", "hooks.example.com", `{"x":1}`, map[string]string{"Origin": "http://evil.example", "Content-Type": "application/json", "Idempotency-Key": "k1"}, 202, ""},
		{"a probe under any name", "GET", "/ready", "postbox.default.svc", "", nil, 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, ts.Base+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.body == "" {
				req.Body, req.ContentLength = nil, 0
			}
			if c.host != "" {
				req.Host = c.host
			}
			for k, v := range c.header {
				req.Header.Set(k, v)
			}
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := ts.HTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, resp.StatusCode, body, c.status)
			}
			if c.code == "" {
				return
			}
			var e struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != c.code {
				t.Fatalf("%s %s: %s, want code %s", c.method, c.path, body, c.code)
			}
			named := map[string]string{"cross_origin": c.header["Origin"], "unsupported_media_type": c.header["Content-Type"],
				"host_not_allowed": c.host}[c.code]
			if !strings.Contains(e.Error.Message, named) {
				t.Errorf("message %q does not name %q", e.Error.Message, named)
			}
		})
	}
	// Nothing the refused requests asked for happened.
	req, _ := http.NewRequest("GET", ts.Base+"/v1/subscriptions", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Subscriptions []struct{ Name string } }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Subscriptions {
		if s.Name != "webhooks" { // the default subscription of POST /webhooks
			names = append(names, s.Name)
		}
	}
	if got := strings.Join(names, ","); got != "b,c,d" {
		t.Fatalf("subscriptions %s, want b,c,d: a refused request created one, or an allowed one did not", got)
	}
}

// TestBrowserGuardConfig: hosts and origins that are not are named.
func TestBrowserGuardConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  server.Config
		want string
	}{
		{server.Config{AllowedHosts: []string{"http://postbox.example.com"}}, "Config.AllowedHosts"},
		{server.Config{AllowedHosts: []string{"postbox.example.com:8000"}}, "Config.AllowedHosts"},
		{server.Config{AllowedOrigins: []string{"ops.example.com"}}, "Config.AllowedOrigins"},
		{server.Config{AllowedOrigins: []string{"https://ops.example.com/console"}}, "Config.AllowedOrigins"},
	} {
		db, err := server.OpenSQLite(server.Config{DBPath: t.TempDir() + "/p.db"})
		if err != nil {
			t.Fatal(err)
		}
		c.cfg.Streams, c.cfg.Store = db, db
		_, err = server.New(c.cfg)
		db.Close()
		var ce *server.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %+v: %v, want a ConfigError naming %s", c.cfg.AllowedHosts, c.cfg.AllowedOrigins, err, c.want)
		}
	}
}
