// Package forwarded says which of a webhook's headers are the event's:
// intake keeps them in its metadata and delivery's workers send them on
// to a target. The rest describe the request to postbox, not the event.
// And it says who a request's client is behind a trusted reverse proxy
// (Proxies.ClientAddr).
package forwarded

import (
	"slices"
	"strings"
)

// headers are the headers a webhook arrived with (kept in its
// event's metadata) that the workers send on to a target, lower case: the
// provider's own identity, event and signature headers and request
// tracing. Any other header (credentials such as Authorization, Cookie or
// X-Api-Key, the first hop's X-Forwarded-*, Host, Content-Length,
// Content-Encoding, Connection, X-HTTP-Method-Override, ...) describes the
// request to postbox, not the event, and is not sent.
var headers = []string{
	"webhook-id", "webhook-timestamp", "webhook-signature", // Standard Webhooks
	"svix-id", "svix-timestamp", "svix-signature",
	"stripe-signature",
	"x-gitlab-event", "x-gitlab-event-uuid", "x-gitlab-webhook-uuid", "x-gitlab-instance",
	"x-slack-signature", "x-slack-request-timestamp",
	"x-twilio-signature",
	"x-shopify-hmac-sha256", "x-shopify-topic", "x-shopify-webhook-id", "x-shopify-event-id",
	"x-shopify-shop-domain", "x-shopify-api-version", "x-shopify-triggered-at",
	"x-request-id", "x-correlation-id", "traceparent", "tracestate",
}

// prefixes are prefixes of forwarded headers, lower case: GitHub's
// X-GitHub-Event, -Delivery, -Hook-ID, ... and X-Hub-Signature(-256).
var prefixes = []string{"x-github-", "x-hub-signature"}

// Header reports whether a webhook's header name (any case) is one the
// workers send on to a target (see headers).
func Header(name string) bool {
	name = strings.ToLower(name)
	if slices.Contains(headers, name) {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
