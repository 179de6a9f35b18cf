package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	ingest "github.com/postbox-events/postbox/internal/intake" // as ingest: the webhooks' own type is named intake
	"github.com/postbox-events/postbox/internal/netpolicy"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// The HTTP API of sources (docs/API.md#sources) and the settings of
// webhook sources.

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

// webhookSettings are the settings of a source of kind webhook, stored as
// its JSON settings. The zero value takes unsigned webhooks with the
// default identity (Idempotency-Key or webhook-id, X-Event-Type).
type webhookSettings struct {
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
	// flags (Config.Webhooks) and holds no other.
	ServeFlags bool `json:"serve_flags,omitempty"`
	// ReplayWindow, for a preset whose provider signs the body alone
	// (GitHub), is how long a body stored under one key is not stored
	// again under another ("0": not at all), e.g. "24h"; "" is
	// DefaultReplayWindow.
	ReplayWindow string `json:"replay_window,omitempty"`
}

// DefaultReplayWindow is how long, by default, the same signed body sent
// to a GitHub source under another X-GitHub-Delivery is answered as the
// duplicate of the first (webhookSettings.ReplayWindow). GitHub signs the
// body alone, so a captured delivery verifies again with any delivery id
// and event header.
const DefaultReplayWindow = 24 * time.Hour

// maxReplayWindow bounds a source's replay window.
const maxReplayWindow = 90 * 24 * time.Hour

// replayWindow returns the source's replay window: 0 when it has none.
func (ws webhookSettings) replayWindow() (time.Duration, error) {
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

// effective returns the settings with the preset's identity filled in
// where the source does not say otherwise.
func (ws webhookSettings) effective() webhookSettings {
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

// validate checks the settings a request gives a webhook source, naming
// the field of what is wrong.
func (ws webhookSettings) validate() error {
	if ws.ServeFlags {
		if ws.Preset != "" || len(ws.Secrets) > 0 || ws.KeyHeader != "" || ws.KeyField != "" || ws.TypeHeader != "" || ws.TypeField != "" || ws.ReplayWindow != "" {
			return errors.New("settings.serve_flags: takes every setting from serve's --webhook-* flags; give no other")
		}
		return nil
	}
	if _, err := ws.replayWindow(); err != nil {
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
			if err := checkText("settings."+f.name, f.v, maxIdentityNameLen); err != nil {
				return err
			}
		}
	}
	return nil
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

// intake is how a webhook source takes webhooks: the identity and size
// settings, and the signature check.
type intake struct {
	cfg  WebhookConfig // MaxBytes, key and type headers and fields
	from identityFrom
	// verify checks a webhook's signature; its error names the header.
	verify func(r *http.Request, body []byte, now time.Time) error
	// replayWindow, when not 0, is how long the same body is not stored
	// under another key (webhookSettings.ReplayWindow).
	replayWindow time.Duration
}

// sourceCacheTTL is how long a webhook source read from the store is used
// without reading it again. This process forgets a source at once when it
// creates or deletes it; other processes sharing the store see the change
// within sourceCacheTTL.
const sourceCacheTTL = time.Second

// sourceCache holds the webhook sources read in the last sourceCacheTTL,
// so that a webhook does not read its source from the store each time.
type sourceCache struct {
	mu sync.Mutex
	m  map[string]cachedSource
}

type cachedSource struct {
	kind string
	in   intake
	at   time.Time
}

func (c *sourceCache) get(name string, now time.Time) (cachedSource, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[name]
	if ok && now.Sub(e.at) >= sourceCacheTTL {
		delete(c.m, name)
		return cachedSource{}, false
	}
	return e, ok
}

func (c *sourceCache) put(name string, e cachedSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]cachedSource{}
	}
	c.m[name] = e
}

func (c *sourceCache) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, name)
}

// webhookIntake returns the intake of source, or answers 404 when there
// is no such source and 400 when it is not of kind webhook.
func (s *Server) webhookIntake(w http.ResponseWriter, r *http.Request, source string) (intake, bool) {
	if source != WebhookSource && !checkName(w, "source", source) { // the default's name is valid: no regexp for every webhook
		return intake{}, false
	}
	now := time.Now()
	e, ok := s.sources.get(source, now)
	if !ok {
		src, err := s.sourceStore.Source(r.Context(), source)
		if errors.Is(err, ingest.ErrNotFound) {
			writeError(w, api.CodeNotFound, "no source %q: create it with postbox sources create %s --kind webhook", source, source)
			return intake{}, false
		}
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, api.CodeUnavailable, "reading source %q: %v; send it again", source, err)
			return intake{}, false
		}
		e = cachedSource{kind: src.Kind, at: now}
		if src.Kind == ingest.KindWebhook {
			var ws webhookSettings
			if err := json.Unmarshal(src.Settings, &ws); err != nil {
				s.log.Error("webhooks: a source's settings do not decode", "source", source, "err", err)
				writeError(w, api.CodeUnavailable, "source %q: its settings do not decode", source)
				return intake{}, false
			}
			e.in = s.intakeOf(ws)
		}
		s.sources.put(source, e)
	}
	if e.kind != ingest.KindWebhook {
		writeError(w, api.CodeInvalidSource, "source %q is of kind %s, not webhook: it takes no webhooks", source, e.kind)
		return intake{}, false
	}
	return e.in, true
}

// intakeOf returns the intake of a webhook source's settings.
func (s *Server) intakeOf(ws webhookSettings) intake {
	none := func(*http.Request, []byte, time.Time) error { return nil }
	if ws.ServeFlags {
		in := intake{cfg: s.cfg.Webhooks, verify: none}
		if keys := s.webhookKeys; len(keys) > 0 {
			in.from, in.verify = fromSigned, standardVerifier(keys)
		}
		return in
	}
	ws = ws.effective()
	in := intake{cfg: WebhookConfig{MaxBytes: s.cfg.Webhooks.MaxBytes, KeyHeader: ws.KeyHeader, KeyField: ws.KeyField,
		TypeHeader: ws.TypeHeader, TypeField: ws.TypeField}, verify: none}
	secrets := ws.Secrets
	switch ws.Preset {
	case PresetGitHub:
		in.from = fromProvider
		in.replayWindow, _ = ws.replayWindow() // validated when created
		in.verify = func(r *http.Request, body []byte, _ time.Time) error {
			if err := webhooksig.GitHub(secrets, r.Header.Get(webhooksig.GitHubHeader), body); err != nil {
				return fmt.Errorf("%s: %w", webhooksig.GitHubHeader, err)
			}
			return nil
		}
	case PresetStripe:
		in.from = fromProvider
		in.verify = func(r *http.Request, body []byte, now time.Time) error {
			if err := webhooksig.Stripe(secrets, r.Header.Get(webhooksig.StripeHeader), body, now); err != nil {
				return fmt.Errorf("%s: %w", webhooksig.StripeHeader, err)
			}
			return nil
		}
	default:
		if len(secrets) > 0 {
			keys := make([][]byte, 0, len(secrets))
			for _, sec := range secrets {
				if k, err := stdwebhook.ParseSecret(sec); err == nil { // validated when created
					keys = append(keys, k)
				}
			}
			in.from, in.verify = fromSigned, standardVerifier(keys)
		}
	}
	return in
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

// fingerprintKey returns the store's key of fingerprints, read (or made)
// the first time; ensureWebhooks reads it before the server is ready.
func (s *Server) fingerprintKey() ([]byte, error) {
	fk := &s.wh.fingerprintKey
	fk.Lock()
	defer fk.Unlock()
	if fk.k == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		k, err := s.delivery.Key(ctx, fingerprintKeyName)
		if err != nil {
			return nil, err
		}
		fk.k = k
	}
	return fk.k, nil
}

// fingerprintKeyName names the store's key of fingerprints
// (delivery.Key).
const fingerprintKeyName = "secret-fingerprints"

// fingerprint identifies a secret (a source's, an endpoint's, a header
// value) to the operator without revealing any of it: "hmac:" and 16 hex
// digits of its HMAC-SHA256 under the store's random key, which is never
// shown. One secret has one fingerprint in a store, so that an operator
// tells which secret is set and whether it changed; a fingerprint says
// nothing of the secret, not even to a guess of it (an unsalted hash
// would confirm a guess of a short secret), and another store gives the
// same secret another fingerprint.
func (s *Server) fingerprint(secret string) string {
	key, err := s.fingerprintKey()
	if err != nil {
		s.log.Error("api: the store's key of fingerprints cannot be read; secrets are shown without them", "err", err)
		return "hmac:unavailable"
	}
	h := hmac.New(sha256.New, key)
	h.Write([]byte(secret))
	var sum [sha256.Size]byte
	return "hmac:" + hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// sourceJSON is src in the API; a webhook source's settings are its
// effective ones, api.WebhookSourceSettings.
func (s *Server) sourceJSON(src ingest.Source) api.Source {
	j := api.Source{Name: src.Name, Kind: src.Kind, Stream: src.Stream, Settings: src.Settings, CreatedAt: src.CreatedAt}
	c := src.Checkpoint
	j.Checkpoint = api.Checkpoint{Cursor: c.Cursor, LastError: c.LastError}
	for _, t := range []struct {
		v  time.Time
		to **time.Time
	}{{c.LastEventAt, &j.Checkpoint.LastEventAt}, {c.LastPollAt, &j.Checkpoint.LastPollAt}, {c.UpdatedAt, &j.Checkpoint.UpdatedAt}} {
		if !t.v.IsZero() {
			v := t.v
			*t.to = &v
		}
	}
	if src.Kind == ingest.KindPoll || src.Kind == ingest.KindFeed {
		j.Settings = ingest.UpstreamSettingsJSON(src, s.fingerprint)
	}
	if src.Kind != ingest.KindWebhook {
		return j
	}
	var ws webhookSettings
	json.Unmarshal(src.Settings, &ws)
	j.Path = "/webhooks/" + src.Name
	secrets := ws.Secrets
	if ws.ServeFlags {
		c := s.cfg.Webhooks
		ws = webhookSettings{ServeFlags: true, KeyHeader: c.KeyHeader, KeyField: c.KeyField, TypeHeader: c.TypeHeader, TypeField: c.TypeField}
		secrets = c.Secrets
		if src.Name == WebhookSource {
			j.Path = "/webhooks"
		}
	}
	ws = ws.effective()
	sj := api.WebhookSourceSettings{Preset: ws.Preset, Secrets: []api.SourceSecret{}, KeyHeader: ws.KeyHeader, KeyField: ws.KeyField,
		TypeHeader: ws.TypeHeader, TypeField: ws.TypeField, ServeFlags: ws.ServeFlags, Signature: "none"}
	if d, err := ws.replayWindow(); err == nil && ws.Preset == PresetGitHub {
		sj.ReplayWindow = delivery.FormatSchedule([]time.Duration{d})
	}
	for _, sec := range secrets {
		sj.Secrets = append(sj.Secrets, api.SourceSecret{Fingerprint: s.fingerprint(sec)})
	}
	switch {
	case ws.Preset != "":
		sj.Signature = ws.Preset
	case len(secrets) > 0:
		sj.Signature = "standard-webhooks"
	}
	j.Settings, _ = json.Marshal(sj)
	return j
}

// SourceRescanInterval is how often the source runner reads the sources
// again (intake.DefaultRescanInterval): sources created or deleted by
// another process of a shared store, and leadership that moved, are acted
// on within it. Sources created or deleted through this process's API are
// acted on at once.
const SourceRescanInterval = ingest.DefaultRescanInterval

// DefaultSourceBufferBytes is the default of Config.SourceBufferBytes:
// 64 MiB, so one poll answer or feed line is at most 32 MiB.
const DefaultSourceBufferBytes = ingest.DefaultBufferBytes

// openSources opens the store of sources (internal/intake) in the
// database delivery keeps its state in, migrating its tables; a source
// that dl's subscriptions read is not deleted.
func openSources(cfg Config, store delivery.Store, dl *delivery.Delivery) (*ingest.Store, error) {
	_, pg := store.(delivery.SharedStore)
	return ingest.Open(context.Background(), store, cfg.Streams, ingest.StoreConfig{PostgreSQL: pg, Readers: dl.ReadersOf,
		Logger: cfg.Logger, Now: cfg.Delivery.Now})
}

// newSourceRunner returns the runner of the sources that read upstream,
// its metrics in reg. Where the store is the stream backend (the SQLite
// default) a checkpoint commits with the events it follows.
func (s *Server) newSourceRunner(reg prometheus.Registerer) (*ingest.Runner, error) {
	var with ingest.AppendWither
	if w, ok := s.streams.(ingest.AppendWither); ok && s.sameStore() {
		with = w
	}
	return ingest.NewRunner(ingest.RunnerConfig{Store: s.sourceStore, Writer: s.writer, AppendWith: with, Leads: s.delivery.Leads,
		Limits: s.cfg.Limits, BufferBytes: s.cfg.SourceBufferBytes, Policy: s.policy(), Registerer: reg, Logger: s.log})
}

// policy is the outbound address policy of the server's connections to
// the URLs an operator gives: delivery's targets, poll and feed sources.
func (s *Server) policy() netpolicy.Policy {
	return netpolicy.Policy{AllowLinkLocal: s.cfg.Delivery.AllowLinkLocalTargets, DenyPrivate: s.cfg.Delivery.DenyPrivateTargets}
}

func (s *Server) createSource(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name     *string         `json:"name"`
		Kind     *string         `json:"kind"`
		Settings json.RawMessage `json:"settings"`
	}
	if !decodeBody(w, r, &req, false) {
		return
	}
	switch {
	case req.Name == nil:
		writeError(w, api.CodeMissingField, "name: required")
		return
	case req.Kind == nil:
		writeError(w, api.CodeMissingField, "kind: required (webhook, poll, feed, or device for the source devices)")
		return
	}
	if !checkName(w, "name", *req.Name) {
		return
	}
	settings := bytes.TrimSpace(req.Settings)
	if bytes.Equal(settings, []byte("null")) {
		settings = nil
	}
	src := ingest.Source{Name: *req.Name, Kind: *req.Kind}
	switch *req.Kind {
	case ingest.KindWebhook:
		var ws webhookSettings
		if len(settings) > 0 {
			if err := decodeSettings(settings, &ws); err != nil {
				writeInvalid(w, err)
				return
			}
		}
		if err := ws.validate(); err != nil {
			writeError(w, api.CodeInvalidField, "%v", err)
			return
		}
		src.Settings, _ = json.Marshal(ws)
	case ingest.KindPoll, ingest.KindFeed:
		var err error
		if src.Settings, err = ingest.UpstreamSettings(*req.Kind, settings, decodeSettings, s.policy().CheckURL); err != nil {
			if errors.Is(err, ingest.ErrRequired) {
				err = &codedError{api.CodeMissingField, err.Error()}
			}
			writeInvalid(w, err)
			return
		}
	case ingest.KindDevice:
		if *req.Name != DeviceSource {
			writeError(w, api.CodeInvalidField, "kind device: the WebSocket ingress stores every device's events in the source %s; create that one, or a webhook source", DeviceSource)
			return
		}
		if len(settings) > 0 && !bytes.Equal(settings, []byte("{}")) {
			writeError(w, api.CodeInvalidField, "settings: a device source has none")
			return
		}
	default:
		writeError(w, api.CodeInvalidField, "kind %q: use webhook, poll, feed, or device for the source %s", *req.Kind, DeviceSource)
		return
	}
	got, created, err := s.sourceStore.CreateSource(r.Context(), src)
	s.sources.forget(src.Name)
	s.deviceGate.Forget()
	s.runner.Poke()
	if err != nil {
		s.writeErr(w, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sourceJSON(got))
}

func (s *Server) listSources(w http.ResponseWriter, r *http.Request) {
	srcs, err := s.sourceStore.Sources(r.Context())
	if err != nil {
		s.writeErr(w, err)
		return
	}
	out := make([]api.Source, 0, len(srcs))
	for _, src := range srcs {
		out = append(out, s.sourceJSON(src))
	}
	writeJSON(w, http.StatusOK, api.SourceList{Sources: out})
}

func (s *Server) getSource(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "source", r.PathValue("name")) {
		return
	}
	src, err := s.sourceStore.Source(r.Context(), r.PathValue("name"))
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sourceJSON(src))
}

func (s *Server) deleteSource(w http.ResponseWriter, r *http.Request) {
	if !checkName(w, "source", r.PathValue("name")) {
		return
	}
	err := s.sourceStore.DeleteSource(r.Context(), r.PathValue("name"))
	s.sources.forget(r.PathValue("name"))
	s.deviceGate.Forget()
	s.runner.Poke()
	if err != nil {
		s.writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
