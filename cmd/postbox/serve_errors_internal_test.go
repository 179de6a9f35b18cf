package main

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
)

// TestServeErrorsNameFlags: the server's Config errors reach the user of
// serve naming its flags and variables, not Config fields.
func TestServeErrorsNameFlags(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	open, err := server.NewDefault(server.Config{DBPath: filepath.Join(dir, "open.db"), Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	runErr := open.Run(t.Context())
	_, tlsErr := server.NewDefault(server.Config{DBPath: filepath.Join(dir, "tls.db"), TLSCert: "cert.pem"})
	_, secretErr := server.NewDefault(server.Config{DBPath: filepath.Join(dir, "secret.db"), Webhooks: server.WebhookConfig{Secrets: []string{"whsec_%%%"}}})
	for _, c := range []struct {
		err  error
		want []string
	}{
		{runErr, []string{"beyond loopback", "--api-token TOKEN (POSTBOX_API_TOKEN)", "--addr 127.0.0.1:PORT", "--insecure-no-api-token (POSTBOX_INSECURE_NO_API_TOKEN=true)"}},
		{tlsErr, []string{"--tls-cert and --tls-key go together"}},
		{secretErr, []string{"--webhook-secret (POSTBOX_WEBHOOK_SECRET): ", "whsec_"}},
	} {
		if _, ok := errors.AsType[*server.ConfigError](c.err); !ok {
			t.Fatalf("%v (%T) is not a server.ConfigError", c.err, c.err)
		}
		got := flagNamed(c.err).Error()
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%q does not say %q", got, w)
			}
		}
		if strings.Contains(got, "Config.") || strings.HasPrefix(got, "server: ") {
			t.Errorf("%q names a Config field", got)
		}
	}
	other := errors.New("Config.Addr of something else")
	if flagNamed(other) != other || flagNamed(nil) != nil {
		t.Error("flagNamed rewrote an error that is not the server's ConfigError")
	}
}
