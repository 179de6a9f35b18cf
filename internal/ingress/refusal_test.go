package ingress_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestRefusalCodes: a refused connection carries its code where a client
// reads it without parsing text, on both transports (the WebSocket's JSON
// error, gRPC's status details), and client.Dial returns it as an
// *client.APIError: an unknown token (which is also ErrUnauthorized) and
// one connection over the limit. A gRPC stream drained at shutdown ends
// with the code unavailable, which the client's Conn reports.
func TestRefusalCodes(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			st := newStore()
			close(st.full)
			tokens := ingress.Tokens{}
			tokens.Add("tok-a", "pi-a")
			tokens.Add("tok-b", "pi-b") // another device: not a replacement of pi-a's connection
			in := newIngress(t, st, ingress.Config{Tokens: tokens, MaxConnections: 1})
			url, _ := tr.serve(t, in)
			refused := func(err error, code api.Code, status int) {
				t.Helper()
				var ae *client.APIError
				if !errors.As(err, &ae) || ae.Code != code || ae.Status != status {
					t.Fatalf("Dial: %v, want an *APIError of code %s, status %d", err, code, status)
				}
			}
			_, err := client.Dial(testCtx(t), url, client.Options{Token: "tok-x"})
			refused(err, api.CodeUnauthorized, http.StatusUnauthorized)
			if !errors.Is(err, client.ErrUnauthorized) {
				t.Errorf("Dial with an unknown token: %v, want ErrUnauthorized", err)
			}
			c, err := client.Dial(testCtx(t), url, client.Options{Token: "tok-a"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = client.Dial(testCtx(t), url, client.Options{Token: "tok-b"})
			refused(err, api.CodeTooManyConnections, http.StatusServiceUnavailable)
			if rs, err := c.Send(testCtx(t), msgs(t, "r", "pi-a", 1)); err != nil || !rs[0].OK() {
				t.Fatalf("Send: %v %+v", err, rs)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := in.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 10*time.Second, "the connection to end", func() bool { return c.Err() != nil })
			var ae *client.APIError
			gotCode := errors.As(c.Err(), &ae)
			switch {
			case !errors.Is(c.Err(), client.ErrClosed):
				t.Errorf("after the drain: %v, want ErrClosed", c.Err())
			case tr.name == "grpc" && (!gotCode || ae.Code != api.CodeUnavailable):
				t.Errorf("gRPC after the drain: %v, want ErrClosed with the code unavailable", c.Err())
			case tr.name == "websocket" && gotCode: // a close status 1001, no code
				t.Errorf("WebSocket after the drain: %v, an *APIError", c.Err())
			}
		})
	}
}

// TestBearerToken: the scheme's name matches without case, as RFC 9110
// says; anything but the Bearer scheme has no token.
func TestBearerToken(t *testing.T) {
	for _, c := range []struct {
		value, token string
		ok           bool
	}{
		{"Bearer tok-a", "tok-a", true},
		{"bearer tok-a", "tok-a", true},
		{"BEARER  tok-a ", "tok-a", true},
		{"Basic dG9rLWE=", "", false},
		{"Bearertok-a", "", false},
		{"tok-a", "", false},
		{"", "", false},
	} {
		if token, ok := ingress.BearerToken(c.value); token != c.token || ok != c.ok {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", c.value, token, ok, c.token, c.ok)
		}
	}
}
