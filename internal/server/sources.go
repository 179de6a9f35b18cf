package server

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/replyto"
)

// The HTTP API of sources (docs/API.md#sources), and the webhook sources'
// intakes (their settings and parsing are internal/intake's) as read from
// the store.

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
	in   intake.Webhook
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
func (s *Server) webhookIntake(w http.ResponseWriter, r *http.Request, source string) (intake.Webhook, bool) {
	if source != WebhookSource && !checkName(w, "source", source) { // the default's name is valid: no regexp for every webhook
		return intake.Webhook{}, false
	}
	now := time.Now()
	e, ok := s.sources.get(source, now)
	if !ok {
		src, err := s.sourceStore.Source(r.Context(), source)
		if errors.Is(err, intake.ErrNotFound) {
			writeError(w, api.CodeNotFound, "no source %q: create it with postbox sources create %s --kind webhook", source, source)
			return intake.Webhook{}, false
		}
		if err != nil {
			w.Header().Set("Retry-After", "1")
			writeError(w, api.CodeUnavailable, "reading source %q: %v; send it again", source, err)
			return intake.Webhook{}, false
		}
		e = cachedSource{kind: src.Kind, at: now}
		if src.Kind == intake.KindWebhook {
			var ws intake.WebhookSettings
			if err := json.Unmarshal(src.Settings, &ws); err != nil {
				s.log.Error("webhooks: a source's settings do not decode", "source", source, "err", err)
				writeError(w, api.CodeUnavailable, "source %q: its settings do not decode", source)
				return intake.Webhook{}, false
			}
			e.in = s.intakeOf(ws)
		}
		s.sources.put(source, e)
	}
	if e.kind != intake.KindWebhook {
		writeError(w, api.CodeInvalidSource, "source %q is of kind %s, not webhook: it takes no webhooks", source, e.kind)
		return intake.Webhook{}, false
	}
	return e.in, true
}

// intakeOf returns the intake of a webhook source's settings, with the
// bounds of serve's configuration and its flags' identity and keys for
// the sources that take them.
func (s *Server) intakeOf(ws intake.WebhookSettings) intake.Webhook {
	c := s.cfg.Webhooks
	return ws.Webhook(intake.ServeConfig{MaxBytes: c.MaxBytes, MaxTypeBytes: s.maxTypeBytes(), Keys: s.webhookKeys,
		Identity: intake.Identity{KeyHeader: c.KeyHeader, KeyField: c.KeyField, TypeHeader: c.TypeHeader, TypeField: c.TypeField}})
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
func (s *Server) sourceJSON(src intake.Source) api.Source {
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
	if src.Kind == intake.KindPoll || src.Kind == intake.KindFeed {
		j.Settings = intake.UpstreamSettingsJSON(src, s.fingerprint)
	}
	if src.Kind != intake.KindWebhook {
		return j
	}
	var ws intake.WebhookSettings
	json.Unmarshal(src.Settings, &ws)
	rate, reply := ws.RateLimit, ws.Reply
	j.Path = "/webhooks/" + src.Name
	secrets := ws.Secrets
	if ws.ServeFlags {
		c := s.cfg.Webhooks
		ws = intake.WebhookSettings{ServeFlags: true, KeyHeader: c.KeyHeader, KeyField: c.KeyField, TypeHeader: c.TypeHeader, TypeField: c.TypeField}
		secrets = c.Secrets
		if src.Name == WebhookSource {
			j.Path = "/webhooks"
		}
	}
	ws = ws.Effective()
	sj := api.WebhookSourceSettings{Preset: ws.Preset, Secrets: []api.SourceSecret{}, KeyHeader: ws.KeyHeader, KeyField: ws.KeyField,
		TypeHeader: ws.TypeHeader, TypeField: ws.TypeField, ServeFlags: ws.ServeFlags, Signature: "none"}
	if d, err := ws.ParseReplayWindow(); err == nil && ws.Preset == intake.PresetGitHub {
		sj.ReplayWindow = delivery.FormatSchedule([]time.Duration{d})
	}
	if rate != nil {
		sj.RateLimit = &api.RateLimit{PerSecond: rate.PerSecond, Burst: rate.EffectiveBurst()}
	}
	for _, sec := range secrets {
		sj.Secrets = append(sj.Secrets, api.SourceSecret{Fingerprint: s.fingerprint(sec)})
	}
	if ws.Preset != "" {
		sj.APIURL = ws.APIURL
		if sj.APIURL == "" {
			sj.APIURL = replyto.DefaultGitHubAPI
			if ws.Preset == intake.PresetStripe {
				sj.APIURL = replyto.DefaultStripeAPI
			}
		}
	}
	sj.HandleHeader, sj.HandlePointer = ws.HandleHeader, ws.HandlePointer
	if reply != nil {
		r := reply.Redacted(s.fingerprint)
		sj.Reply = &api.ReplySettings{Headers: r.Headers, SigningSecret: r.SigningSecret}
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

// DefaultSourceBufferBytes is the default of Config.SourceBufferBytes:
// 64 MiB, so one poll answer or feed line is at most 32 MiB.
const DefaultSourceBufferBytes = intake.DefaultBufferBytes

// openSources opens the store of sources (internal/intake) in the
// database delivery keeps its state in, migrating its tables; a source
// that dl's subscriptions read is not deleted.
func openSources(cfg Config, store delivery.Store, dl *delivery.Delivery) (*intake.Store, error) {
	_, pg := store.(delivery.SharedStore)
	return intake.Open(context.Background(), store, cfg.Streams, intake.StoreConfig{PostgreSQL: pg, Readers: dl.ReadersOf,
		Logger: cfg.Logger, Now: cfg.Delivery.Now})
}

// newSourceRunner returns the runner of the sources that read upstream,
// its metrics in reg. Where the store is the stream backend (the SQLite
// default) a checkpoint commits with the events it follows.
func (s *Server) newSourceRunner(reg prometheus.Registerer) (*intake.Runner, error) {
	var with intake.AppendWither
	if w, ok := s.streams.(intake.AppendWither); ok && s.sameStore() {
		with = w
	}
	return intake.NewRunner(intake.RunnerConfig{Store: s.sourceStore, Writer: s.writer, AppendWith: with, Leads: s.delivery.Leads,
		Limits: s.cfg.Limits, BufferBytes: s.cfg.SourceBufferBytes, Policy: s.cfg.Delivery.Policy(), Registerer: reg, Logger: s.log})
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
	src := intake.Source{Name: *req.Name, Kind: *req.Kind}
	switch *req.Kind {
	case intake.KindWebhook:
		var ws intake.WebhookSettings
		if len(settings) > 0 {
			if err := decodeSettings(settings, &ws); err != nil {
				writeInvalid(w, err)
				return
			}
		}
		if err := ws.Validate(); err != nil {
			writeError(w, api.CodeInvalidField, "%v", err)
			return
		}
		src.Settings, _ = json.Marshal(ws)
	case intake.KindPoll, intake.KindFeed:
		var err error
		if src.Settings, err = intake.UpstreamSettings(*req.Kind, settings, decodeSettings, s.cfg.Delivery.Policy().CheckURL); err != nil {
			if errors.Is(err, intake.ErrRequired) {
				err = &codedError{api.CodeMissingField, err.Error()}
			}
			writeInvalid(w, err)
			return
		}
	case intake.KindDevice:
		if len(settings) > 0 && !bytes.Equal(settings, []byte("{}")) {
			var ds map[string]json.RawMessage
			if json.Unmarshal(settings, &ds) == nil && ds["reply"] != nil {
				writeError(w, api.CodeInvalidField, "settings.reply: postbox cannot reply to a device (it has no channel back to a device's agent): answer through your own device API, to the device_id and session_id of the event's delivery handle")
				return
			}
			writeError(w, api.CodeInvalidField, "settings: a device source has none")
			return
		}
	default:
		writeError(w, api.CodeInvalidField, "kind %q: use webhook, poll, feed or device", *req.Kind)
		return
	}
	got, created, err := s.sourceStore.CreateSource(r.Context(), src)
	s.sources.forget(src.Name)
	s.deviceGate.Forget()
	s.deviceSources.forget(src.Name)
	s.runner.Poke()
	if err != nil {
		s.writeErr(w, err)
		return
	}
	s.metrics.Source(got.Name, got.Kind == intake.KindWebhook)
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
	s.deviceSources.forget(r.PathValue("name"))
	s.runner.Poke()
	if err != nil {
		s.writeErr(w, err)
		return
	}
	s.metrics.Forget(r.PathValue("name"))
	w.WriteHeader(http.StatusNoContent)
}
