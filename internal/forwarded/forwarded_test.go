package forwarded_test

import (
	"testing"

	"github.com/postbox-events/postbox/internal/forwarded"
)

func TestHeader(t *testing.T) {
	for name, want := range map[string]bool{
		"Webhook-Id":          true,
		"X-GitHub-Event":      true, // by prefix, any case
		"x-hub-signature-256": true,
		"Stripe-Signature":    true,
		"traceparent":         true,
		"Authorization":       false,
		"Cookie":              false,
		"X-Api-Key":           false,
		"X-Forwarded-For":     false,
		"Content-Encoding":    false,
		"Host":                false,
		"X-GitHubEvent":       false, // not the prefix
	} {
		if got := forwarded.Header(name); got != want {
			t.Errorf("Header(%q) = %v, want %v", name, got, want)
		}
	}
}
