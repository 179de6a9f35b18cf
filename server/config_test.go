package server_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/server"
)

// TestConfigErrorsNameFields: New refuses a Config it cannot serve with an
// error naming the Config field, never a flag of postbox serve.
func TestConfigErrorsNameFields(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		cfg  server.Config
		want string
	}{
		{"workers", server.Config{Delivery: server.DeliveryConfig{Workers: -1}}, "Config.Delivery.Workers must not be negative"},
		{"max attempts", server.Config{Delivery: server.DeliveryConfig{MaxAttempts: -3}}, "Config.Delivery.MaxAttempts"},
		{"queue size", server.Config{QueueSize: -1}, "Config.QueueSize"},
		{"read timeout", server.Config{ReadTimeout: -time.Second}, "Config.ReadTimeout"},
		{"webhook bytes", server.Config{Webhooks: server.WebhookConfig{MaxBytes: -1}}, "Config.Webhooks.MaxBytes"},
		{"retry delays", server.Config{Delivery: server.DeliveryConfig{RetryBaseDelay: time.Minute, RetryMaxDelay: time.Second}},
			"Config.Delivery.RetryBaseDelay 1m0s is above Config.Delivery.RetryMaxDelay 1s"},
		{"retry base above the default max", server.Config{Delivery: server.DeliveryConfig{RetryBaseDelay: time.Hour}},
			"Config.Delivery.RetryMaxDelay 5m0s"},
		{"tls", server.Config{TLSCert: "cert.pem"}, "Config.TLSCert and Config.TLSKey go together"},
		{"synchronous", server.Config{Synchronous: "OFF"}, `Config.Synchronous "OFF"`},
		{"wal checkpoint", server.Config{WALCheckpoint: "never"}, `Config.WALCheckpoint "never": use auto or litestream`},
		{"secret", server.Config{Webhooks: server.WebhookConfig{Secrets: []string{"whsec_%%%"}}}, "Config.Webhooks.Secrets[0]"},
		{"short secret", server.Config{Webhooks: server.WebhookConfig{Secrets: []string{"whsec_bm9wZQ=="}}}, "Config.Webhooks.Secrets[0]: webhook secret: a key of 4 bytes; want 16 to 128"},
		{"nil handler", server.Config{Handlers: map[string]server.Handler{"orders": nil}}, `Config.Handlers["orders"] is nil`},
		{"store alone", server.Config{Store: &server.PostgresStore{}}, "Config.Store without Config.Streams"},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.DBPath = filepath.Join(dir, c.name+".db")
			srv, err := server.New(c.cfg)
			if err == nil {
				srv.Close()
				t.Fatalf("New accepted %+v", c.cfg)
			}
			if !strings.HasPrefix(err.Error(), "server: ") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New: %v, want an error naming %q", err, c.want)
			}
			if strings.Contains(err.Error(), "--") {
				t.Errorf("New: %v names a flag", err)
			}
		})
	}
}

// TestRunRefusesAnOpenAPIBeyondLoopback: Run's refusal names the Config
// fields that lift it, and one of them does.
func TestRunRefusesAnOpenAPIBeyondLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{DBPath: filepath.Join(t.TempDir(), "p.db"), Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "Config.APIToken") || !strings.Contains(err.Error(), "Config.InsecureNoAPIToken") ||
		strings.Contains(err.Error(), "--") {
		t.Fatalf("Run beyond loopback without an API token: %v, want a refusal naming Config.APIToken and Config.InsecureNoAPIToken", err)
	}
}

// TestAllowedHostsAndOrigins: a program that embeds the server lets its
// operator API answer under its DNS name, and a page of its own console's
// origin change state, through Config. The request passes the guard to
// the handler, which refuses its body (400), not its origin (403) or host
// (421).
func TestAllowedHostsAndOrigins(t *testing.T) {
	for _, c := range []struct {
		name         string
		hosts, origs []string
		want         int
	}{
		{"name not allowed", nil, nil, http.StatusMisdirectedRequest},
		{"name allowed", []string{"postbox.example.com"}, nil, http.StatusForbidden},
		{"name and origin allowed", []string{"postbox.example.com"}, []string{"https://ops.example.com"}, http.StatusBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, err := server.New(server.Config{DBPath: filepath.Join(t.TempDir(), "p.db"), AllowedHosts: c.hosts, AllowedOrigins: c.origs})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			req := httptest.NewRequest(http.MethodPost, "http://postbox.example.com/v1/sources",
				strings.NewReader(`{"kind":"webhook"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Origin", "https://ops.example.com")
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			w := httptest.NewRecorder()
			srv.Handler().ServeHTTP(w, req)
			if w.Code != c.want {
				t.Fatalf("POST /v1/sources under postbox.example.com from https://ops.example.com: %d %s, want %d", w.Code, w.Body, c.want)
			}
		})
	}
}
