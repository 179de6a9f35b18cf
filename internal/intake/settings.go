package intake

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// Webhook presets: the providers whose identity headers and signature
// scheme a webhook source can take by name.
const (
	PresetGitHub = "github"
	PresetStripe = "stripe"
)

// Bounds of a webhook source's settings.
const (
	maxSourceSecrets   = 10   // secrets at once, while rotating
	maxSourceSecretLen = 1024 // bytes of one
	maxIdentityNameLen = 128  // bytes of a key or type header or field name
)

// WebhookSettings are the settings of a source of kind webhook, stored
// as its JSON settings. The zero value takes unsigned webhooks with the
// default identity (Idempotency-Key or webhook-id, X-Event-Type).
type WebhookSettings struct {
	// Preset names a provider (PresetGitHub, PresetStripe): its key and
	// type come from where the provider puts them (unless the fields
	// below say otherwise), and every webhook must carry the provider's
	// signature by one of Secrets.
	Preset string `json:"preset,omitempty"`
	// Secrets verify each webhook: with a preset, the provider's secrets
	// as written at the provider; without one, Standard Webhooks secrets
	// ("whsec_…"). None: webhooks are not verified (no preset only).
	Secrets    []string `json:"secrets,omitempty"`
	KeyHeader  string   `json:"key_header,omitempty"`
	KeyField   string   `json:"key_field,omitempty"`
	TypeHeader string   `json:"type_header,omitempty"`
	TypeField  string   `json:"type_field,omitempty"`
	// ServeFlags, the default source's, takes every setting from serve's
	// flags (ServeConfig) and holds no other.
	ServeFlags bool `json:"serve_flags,omitempty"`
	// ReplayWindow, for a preset whose provider signs the body alone
	// (GitHub), is how long a body stored under one key is not stored
	// again under another ("0": not at all), e.g. "24h"; "" is
	// DefaultReplayWindow.
	ReplayWindow string `json:"replay_window,omitempty"`
	// RateLimit, when set, bounds the webhooks the source stores, over
	// every node of a shared store: one over it is answered 429 with
	// Retry-After (internal/intakerate). It may go with ServeFlags.
	RateLimit *intakerate.Rate `json:"rate_limit,omitempty"`
	// APIURL, for a preset, is the base of the provider's API that
	// delivery handles point into: "" is replyto.DefaultGitHubAPI or
	// replyto.DefaultStripeAPI (GitHub Enterprise: https://HOST/api/v3).
	APIURL string `json:"api_url,omitempty"`
	// HandleHeader or HandlePointer, without a preset, say where each
	// webhook carries its delivery handle: a request header, or a JSON
	// pointer (RFC 6901) into the body. An absolute http(s) URL there is
	// the handle's url, any other string its target.
	HandleHeader  string `json:"handle_header,omitempty"`
	HandlePointer string `json:"handle_pointer,omitempty"`
	// Reply holds what a reply to the source's events carries.
	Reply *replyto.Settings `json:"reply,omitempty"`
}

// DefaultReplayWindow is how long, by default, the same signed body sent
// to a GitHub source under another X-GitHub-Delivery is answered as the
// duplicate of the first (WebhookSettings.ReplayWindow). GitHub signs the
// body alone, so a captured delivery verifies again with any delivery id
// and event header.
const DefaultReplayWindow = 24 * time.Hour

// maxReplayWindow bounds a source's replay window.
const maxReplayWindow = 90 * 24 * time.Hour

// ParseReplayWindow returns the source's replay window: 0 when it has
// none, DefaultReplayWindow for a GitHub source that does not say.
func (ws WebhookSettings) ParseReplayWindow() (time.Duration, error) {
	if ws.Preset != PresetGitHub {
		if ws.ReplayWindow != "" {
			return 0, fmt.Errorf("settings.replay_window: only for the github preset, whose signature covers the body alone (Stripe's covers a timestamp, and Standard Webhooks' the webhook-id)")
		}
		return 0, nil
	}
	if ws.ReplayWindow == "" {
		return DefaultReplayWindow, nil
	}
	d, err := time.ParseDuration(ws.ReplayWindow)
	if err != nil || d < 0 || d > maxReplayWindow {
		return 0, fmt.Errorf("settings.replay_window %q: want a duration from 0 (none) to %v, e.g. 24h", ws.ReplayWindow, maxReplayWindow)
	}
	return d, nil
}

// Effective returns the settings with the preset's identity filled in
// where the source does not say otherwise.
func (ws WebhookSettings) Effective() WebhookSettings {
	switch ws.Preset {
	case PresetGitHub:
		if ws.KeyHeader == "" && ws.KeyField == "" {
			ws.KeyHeader = "X-GitHub-Delivery"
		}
		if ws.TypeHeader == "" && ws.TypeField == "" {
			ws.TypeHeader = "X-GitHub-Event"
		}
	case PresetStripe:
		if ws.KeyHeader == "" && ws.KeyField == "" {
			ws.KeyField = "id"
		}
		if ws.TypeHeader == "" && ws.TypeField == "" {
			ws.TypeField = "type"
		}
	}
	return ws
}

// Validate checks the settings a request gives a webhook source, naming
// the field of what is wrong.
func (ws WebhookSettings) Validate() error {
	if ws.RateLimit != nil {
		if err := ws.RateLimit.Validate("settings.rate_limit"); err != nil {
			return err
		}
	}
	if ws.Reply != nil {
		if err := ws.Reply.Validate("settings.reply"); err != nil {
			return err
		}
	}
	if ws.ServeFlags {
		if ws.Preset != "" || len(ws.Secrets) > 0 || ws.KeyHeader != "" || ws.KeyField != "" || ws.TypeHeader != "" || ws.TypeField != "" || ws.ReplayWindow != "" ||
			ws.APIURL != "" || ws.HandleHeader != "" || ws.HandlePointer != "" {
			return errors.New("settings.serve_flags: takes every setting from serve's --webhook-* flags; give no other (but rate_limit and reply)")
		}
		return nil
	}
	if err := ws.validateHandle(); err != nil {
		return err
	}
	if _, err := ws.ParseReplayWindow(); err != nil {
		return err
	}
	switch ws.Preset {
	case "":
	case PresetGitHub, PresetStripe:
		if len(ws.Secrets) == 0 {
			return fmt.Errorf("settings.secrets: the %s preset verifies every webhook's signature: give the secret set at %s", ws.Preset, ws.Preset)
		}
	default:
		return fmt.Errorf("settings.preset %q: use github or stripe, or none", ws.Preset)
	}
	if len(ws.Secrets) > maxSourceSecrets {
		return fmt.Errorf("settings.secrets: %d secrets, at most %d", len(ws.Secrets), maxSourceSecrets)
	}
	for i, sec := range ws.Secrets {
		if sec == "" || strings.TrimSpace(sec) != sec || len(sec) > maxSourceSecretLen {
			return fmt.Errorf("settings.secrets[%d]: want 1 to %d bytes without surrounding space", i, maxSourceSecretLen)
		}
		if ws.Preset == "" {
			if !strings.HasPrefix(sec, "whsec_") {
				return fmt.Errorf("settings.secrets[%d]: a Standard Webhooks secret is whsec_ and base64 (or give a preset)", i)
			}
			if _, err := stdwebhook.CheckSecret(sec); err != nil {
				return fmt.Errorf("settings.secrets[%d]: %v (or give a preset)", i, err)
			}
		}
	}
	for _, f := range []struct{ name, v string }{
		{"key_header", ws.KeyHeader}, {"type_header", ws.TypeHeader},
	} {
		if f.v != "" && !validHeaderName(f.v) {
			return fmt.Errorf("settings.%s %q: not a header name", f.name, f.v)
		}
	}
	for _, f := range []struct{ name, v string }{
		{"key_field", ws.KeyField}, {"type_field", ws.TypeField},
	} {
		if f.v != "" {
			if err := CheckText("settings."+f.name, f.v, maxIdentityNameLen); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateHandle checks the settings of delivery handles: api_url for a
// preset, handle_header or handle_pointer without one.
func (ws WebhookSettings) validateHandle() error {
	if ws.APIURL != "" {
		if ws.Preset != PresetGitHub && ws.Preset != PresetStripe {
			return errors.New("settings.api_url: only for the github and stripe presets, whose delivery handles point into the provider's API")
		}
		if err := replyto.CheckAPIURL("settings.api_url", ws.APIURL); err != nil {
			return err
		}
	}
	if ws.HandleHeader == "" && ws.HandlePointer == "" {
		return nil
	}
	if ws.Preset != "" {
		return fmt.Errorf("settings.handle_header, settings.handle_pointer: the %s preset makes its own delivery handles; give these without a preset", ws.Preset)
	}
	if ws.HandleHeader != "" && ws.HandlePointer != "" {
		return errors.New("settings.handle_header and settings.handle_pointer: give one of them, where each webhook carries its delivery handle")
	}
	if ws.HandleHeader != "" && !validHeaderName(ws.HandleHeader) {
		return fmt.Errorf("settings.handle_header %q: not a header name", ws.HandleHeader)
	}
	if ws.HandlePointer != "" {
		if len(ws.HandlePointer) > maxIdentityNameLen {
			return fmt.Errorf("settings.handle_pointer: %d bytes, at most %d", len(ws.HandlePointer), maxIdentityNameLen)
		}
		if _, err := poll.ParsePointer(ws.HandlePointer); err != nil {
			return fmt.Errorf("settings.handle_pointer: %w", err)
		}
	}
	return nil
}

// apiURL is the base of the preset's API: APIURL, else the provider's.
func (ws WebhookSettings) apiURL() string {
	switch {
	case ws.APIURL != "":
		return ws.APIURL
	case ws.Preset == PresetStripe:
		return replyto.DefaultStripeAPI
	}
	return replyto.DefaultGitHubAPI
}

// validHeaderName reports whether v is an HTTP header name (a token) of
// at most maxIdentityNameLen bytes.
func validHeaderName(v string) bool {
	if v == "" || len(v) > maxIdentityNameLen {
		return false
	}
	for _, c := range []byte(v) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ServeConfig is what serve's configuration gives webhook sources: the
// bounds of every source's webhooks, and the identity and Standard
// Webhooks keys of a source that takes serve's flags
// (WebhookSettings.ServeFlags, the default source webhooks).
type ServeConfig struct {
	MaxBytes     int64 // largest body accepted
	MaxTypeBytes int   // longest type, as Limits bound an envelope's
	Identity     Identity
	// Keys are the decoded Standard Webhooks secrets (--webhook-secret,
	// stdwebhook.ParseSecret); none: webhooks are not verified.
	Keys [][]byte
}

// Webhook returns how a source with these settings takes webhooks. The
// settings were validated when the source was created; a secret that
// does not decode is left out.
func (ws WebhookSettings) Webhook(serve ServeConfig) Webhook {
	wh := Webhook{MaxBytes: serve.MaxBytes, MaxTypeBytes: serve.MaxTypeBytes}
	if ws.RateLimit != nil {
		wh.RateLimit = *ws.RateLimit
	}
	if ws.ServeFlags {
		wh.Identity = serve.Identity
		if len(serve.Keys) > 0 {
			wh.from, wh.verify = fromSigned, standardVerifier(serve.Keys)
		}
		return wh
	}
	ws = ws.Effective()
	wh.Identity = Identity{KeyHeader: ws.KeyHeader, KeyField: ws.KeyField, TypeHeader: ws.TypeHeader, TypeField: ws.TypeField}
	secrets := ws.Secrets
	switch ws.Preset {
	case PresetGitHub:
		wh.handle = githubHandle(ws.apiURL())
		wh.from = fromProvider
		wh.ReplayWindow, _ = ws.ParseReplayWindow() // validated when created
		wh.verify = func(r *http.Request, body []byte, _ time.Time) error {
			if err := webhooksig.GitHub(secrets, r.Header.Get(webhooksig.GitHubHeader), body); err != nil {
				return fmt.Errorf("%s: %w", webhooksig.GitHubHeader, err)
			}
			return nil
		}
	case PresetStripe:
		wh.handle = stripeHandle(ws.apiURL())
		wh.from = fromProvider
		wh.verify = func(r *http.Request, body []byte, now time.Time) error {
			if err := webhooksig.Stripe(secrets, r.Header.Get(webhooksig.StripeHeader), body, now); err != nil {
				return fmt.Errorf("%s: %w", webhooksig.StripeHeader, err)
			}
			return nil
		}
	default:
		switch {
		case ws.HandleHeader != "":
			wh.handle = headerHandle(http.CanonicalHeaderKey(ws.HandleHeader))
		case ws.HandlePointer != "":
			ptr, _ := poll.ParsePointer(ws.HandlePointer) // validated when created
			wh.handle = pointerHandle(ptr)
		}
		if len(secrets) > 0 {
			keys := make([][]byte, 0, len(secrets))
			for _, sec := range secrets {
				if k, err := stdwebhook.ParseSecret(sec); err == nil { // validated when created
					keys = append(keys, k)
				}
			}
			wh.from, wh.verify = fromSigned, standardVerifier(keys)
		}
	}
	return wh
}

// standardVerifier checks a Standard Webhooks signature by one of keys.
func standardVerifier(keys [][]byte) func(*http.Request, []byte, time.Time) error {
	return func(r *http.Request, body []byte, now time.Time) error {
		err := stdwebhook.Verify(keys, r.Header.Get("Webhook-Id"), r.Header.Get("Webhook-Timestamp"), r.Header.Get("Webhook-Signature"), body, now)
		if err != nil {
			return fmt.Errorf("Standard Webhooks signature (webhook-id, webhook-timestamp, webhook-signature): %w", err)
		}
		return nil
	}
}
