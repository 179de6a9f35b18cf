// Package replyto holds what postbox needs to send a reply to where an
// event came from: the delivery handle each source kind captures at
// intake (its shape and kinds), and a source's reply settings (the
// credentials a reply carries).
package replyto

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/stdwebhook"
)

// Kinds of delivery handle: the "kind" member of every handle.
const (
	KindGitHub      = api.HandleGitHub      // an issue or pull request: url is its comments endpoint
	KindStripe      = api.HandleStripe      // an object of Stripe's API: url is the object
	KindCloudEvents = api.HandleCloudEvents // source and subject; no url
	KindPoll        = api.HandlePoll        // members read by a poll source's configured pointers
	KindWebhook     = api.HandleWebhook     // a generic webhook's configured header or pointer
	KindDevice      = api.HandleDevice      // a device's event: device_id and session_id; no reply
)

// Handle is the part of a delivery handle a reply reads: every handle is
// a JSON object with a kind, and those a reply can go to have an
// absolute http(s) url. Other members describe the target and vary by
// kind.
type Handle struct {
	Kind string `json:"kind"`
	URL  string `json:"url,omitempty"`
}

// Bounds of reply settings.
const (
	maxHeaders     = 32
	maxHeaderValue = 4096
)

// Settings are a source's reply settings (the "reply" member of its
// settings): the headers a reply carries, a value "env:NAME" read from
// the environment variable NAME at each attempt and never stored, and a
// Standard Webhooks secret ("whsec_…") that signs each reply.
//
// The headers go only where the source's settings, not its senders, say:
// to a preset's API (the url of a github or stripe handle is built from
// the source's api_url) and to Origins. A generic webhook's or a poll's
// handle url comes with the data, so a reply with headers to one goes
// only to an origin listed in Origins ("https://chat.example").
type Settings struct {
	Headers       map[string]string `json:"headers,omitempty"`
	SigningSecret string            `json:"signing_secret,omitempty"`
	Origins       []string          `json:"origins,omitempty"`
}

// maxOrigins bounds Settings.Origins.
const maxOrigins = 16

// Allows reports whether a reply with s's headers may go to url of a
// handle of kind, and when not, an error saying what to change.
func (s Settings) Allows(kind, target string) error {
	if len(s.Headers) == 0 || kind == KindGitHub || kind == KindStripe {
		return nil
	}
	origin := originOf(target)
	for _, o := range s.Origins {
		if strings.EqualFold(strings.TrimRight(o, "/"), origin) {
			return nil
		}
	}
	return fmt.Errorf("the handle's url %.200q is not at an origin of the source's settings.reply.origins, and the source's reply headers go only there: add %q to them if it is yours (a %s handle's url comes with the event, from its sender)", target, origin, kind)
}

// originOf returns scheme://host[:port] of a URL, lower case.
func originOf(target string) string {
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	return strings.ToLower(u.Scheme + "://" + u.Host)
}

// refused are headers reply settings may not set: hop-by-hop, what
// describes the body, and what postbox sets itself.
var refused = []string{
	"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding",
	"upgrade", "host",
	"content-length", "content-type", "content-encoding", "expect", "idempotency-key", "user-agent",
}

// Validate names the setting that is wrong, under prefix (e.g.
// "settings.reply").
func (s Settings) Validate(prefix string) error {
	if len(s.Headers) > maxHeaders {
		return fmt.Errorf("%s.headers: %d headers, at most %d", prefix, len(s.Headers), maxHeaders)
	}
	seen := make(map[string]string, len(s.Headers))
	for name, v := range s.Headers {
		if other, dup := seen[http.CanonicalHeaderKey(name)]; dup {
			return fmt.Errorf("%s.headers: %s and %s are one header", prefix, other, name)
		}
		seen[http.CanonicalHeaderKey(name)] = name
		if !httpguts.ValidHeaderFieldName(name) {
			return fmt.Errorf("%s.headers: %q is not a header name", prefix, name)
		}
		lower := strings.ToLower(name)
		for _, r := range refused {
			if lower == r {
				return fmt.Errorf("%s.headers: %s is set by postbox", prefix, name)
			}
		}
		if strings.HasPrefix(lower, "webhook-") {
			return fmt.Errorf("%s.headers: %s: webhook-* headers are postbox's signature (set signing_secret)", prefix, name)
		}
		if env, ok := strings.CutPrefix(v, "env:"); ok && env == "" {
			return fmt.Errorf("%s.headers.%s: env: names no variable", prefix, name)
		}
		if len(v) > maxHeaderValue || strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("%s.headers.%s: at most %d bytes, no line breaks", prefix, name, maxHeaderValue)
		}
	}
	if len(s.Origins) > maxOrigins {
		return fmt.Errorf("%s.origins: %d, at most %d", prefix, len(s.Origins), maxOrigins)
	}
	for _, o := range s.Origins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			strings.TrimRight(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("%s.origins: %.200q: want an origin, scheme://host[:port], e.g. https://chat.example", prefix, o)
		}
	}
	if s.SigningSecret != "" {
		if !strings.HasPrefix(s.SigningSecret, "whsec_") {
			return fmt.Errorf("%s.signing_secret: want whsec_ and base64", prefix)
		}
		if _, err := stdwebhook.CheckSecret(s.SigningSecret); err != nil {
			return fmt.Errorf("%s.signing_secret: %s", prefix, strings.TrimPrefix(err.Error(), "webhook secret: "))
		}
	}
	return nil
}

// Redacted returns s with its header values that are not env:NAME, and
// its signing secret, replaced by fingerprints, for the API.
func (s Settings) Redacted(fingerprint func(string) string) Settings {
	if len(s.Headers) > 0 {
		h := make(map[string]string, len(s.Headers))
		for k, v := range s.Headers {
			if !strings.HasPrefix(v, "env:") {
				v = fingerprint(v)
			}
			h[k] = v
		}
		s.Headers = h
	}
	if s.SigningSecret != "" {
		s.SigningSecret = fingerprint(s.SigningSecret)
	}
	return s
}

// Header builds a reply's headers, reading env:NAME values with lookup;
// a variable that is not set is an error naming it.
func (s Settings) Header(lookup func(string) (string, bool)) (http.Header, error) {
	return EnvHeader(s.Headers, lookup)
}

// EnvHeader builds request headers of name → value, a value "env:NAME"
// read with lookup when the request is made (a reply's, a poll's); a
// variable that is not set is an error naming it.
func EnvHeader(values map[string]string, lookup func(string) (string, bool)) (http.Header, error) {
	h := http.Header{}
	for name, v := range values {
		if env, ok := strings.CutPrefix(v, "env:"); ok {
			val, set := lookup(env)
			if !set {
				return nil, fmt.Errorf("header %s: the environment variable %s is not set", name, env)
			}
			v = val
		}
		h.Set(name, v)
	}
	return h, nil
}

// ErrNoURL is the error of Target for a handle a reply cannot go to.
var ErrNoURL = errors.New("no reply url")

// Target returns the url a reply to handle goes to, or an error saying
// why there is none: no handle, a device's (postbox has no channel back
// to a device's agent), or a handle without an http(s) url.
func Target(h Handle) (string, error) {
	switch {
	case h.Kind == "":
		return "", fmt.Errorf("%w: the event has no delivery handle", ErrNoURL)
	case h.Kind == KindDevice:
		return "", fmt.Errorf("%w: the event came from a device, and postbox has no channel back to a device's agent; answer it through your own device API (the handle names its device_id and session_id)", ErrNoURL)
	case h.URL == "":
		return "", fmt.Errorf("%w: the %s handle names no url to reply to", ErrNoURL, h.Kind)
	}
	u, err := url.Parse(h.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%w: the handle's url %.200q is not an http(s) URL", ErrNoURL, h.URL)
	}
	return h.URL, nil
}
