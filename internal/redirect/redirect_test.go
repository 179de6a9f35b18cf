package redirect_test

import (
	"net/url"
	"testing"

	"github.com/postbox-events/postbox/internal/redirect"
)

// TestOrigin: a URL's origin writes out the default port, so that
// http://a and http://a:80 are one origin and http://a:81 another.
func TestOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"http://API.example.com/x?y": "http://api.example.com:80",
		"http://api.example.com:80/": "http://api.example.com:80",
		"https://api.example.com/":   "https://api.example.com:443",
		"http://127.0.0.1:8081/a":    "http://127.0.0.1:8081",
		"http://[::1]:9/":            "http://[::1]:9",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := redirect.Origin(u); got != want {
			t.Errorf("Origin(%s) = %s, want %s", in, got, want)
		}
	}
}
