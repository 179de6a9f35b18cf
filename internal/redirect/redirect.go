// Package redirect is the redirect policy of postbox's requests that
// carry an operator's credentials upstream (poll sources' headers, feed
// sources' tokens): a redirect is followed only to the origin of the
// first request (its scheme, host and port), or not at all, so that no
// header or token reaches another host. Go's client forwards custom
// headers to any host on a redirect, and Authorization to another port
// of the same host; this policy is what stops that.
//
// Every hop goes through the client's own transport, so its dialer's
// address policy (netpolicy.Policy.Control) applies to each.
package redirect

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The policies a source's "redirects" setting names.
const (
	// SameOrigin follows a redirect to the same scheme, host and port
	// (at most MaxHops), and refuses one elsewhere. The default.
	SameOrigin = "same-origin"
	// None follows no redirect: a 3xx answer is a failed request.
	None = "none"
)

// MaxHops bounds the redirects one request follows.
const MaxHops = 10

// Validate returns an error naming field when policy is not "",
// SameOrigin or None.
func Validate(field, policy string) error {
	switch policy {
	case "", SameOrigin, None:
		return nil
	}
	return fmt.Errorf("%s %q: want %s (follow a redirect only to the same scheme, host and port; the default) or %s", field, policy, SameOrigin, None)
}

// ErrRefused is in the error of a redirect the policy does not follow.
var ErrRefused = errors.New("redirect not followed")

// Check returns the http.Client CheckRedirect of policy ("" is
// SameOrigin). Its errors name the origin redirected to, never its path
// or query (which may hold a cursor or a token).
func Check(policy string) func(req *http.Request, via []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if policy == None {
			return fmt.Errorf("%w: redirected to %s (redirects: %s)", ErrRefused, Origin(req.URL), None)
		}
		if len(via) >= MaxHops {
			return fmt.Errorf("%w: more than %d redirects", ErrRefused, MaxHops)
		}
		if from, to := Origin(via[0].URL), Origin(req.URL); from != to {
			return fmt.Errorf("%w: redirected from %s to %s, another origin (redirects: %s; the source's headers and token go only to its own origin)", ErrRefused, from, to, SameOrigin)
		}
		return nil
	}
}

// Origin returns u's scheme://host:port, lower case, with the scheme's
// default port written out.
func Origin(u *url.URL) string {
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		switch scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return scheme + "://" + host + ":" + port
}

// Client returns a copy of c (nil: http.DefaultClient) that follows
// redirects as policy says; c stays as it was.
func Client(c *http.Client, policy string) *http.Client {
	if c == nil {
		c = http.DefaultClient
	}
	cp := *c
	cp.CheckRedirect = Check(policy)
	return &cp
}
