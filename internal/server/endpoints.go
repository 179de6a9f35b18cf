package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/delivery"
)

// The endpoint settings of a subscription's target, in the API
// (docs/API.md#endpoints), and the attempt log of an item.

// endpointRequest is the part of a subscription's create or patch body
// that sets its endpoint. Each field is raw, so that a patch tells absent
// (unchanged) from null (the server's setting; for secret: no signing).
type endpointRequest struct {
	Secret          json.RawMessage `json:"secret"`
	SecretOverlap   json.RawMessage `json:"secret_overlap"`
	Headers         json.RawMessage `json:"headers"`
	Timeout         json.RawMessage `json:"timeout"`
	RetrySchedule   json.RawMessage `json:"retry_schedule"`
	RetryBaseDelay  json.RawMessage `json:"retry_base_delay"`
	RetryMaxDelay   json.RawMessage `json:"retry_max_delay"`
	MaxAttempts     json.RawMessage `json:"max_attempts"`
	Rate            json.RawMessage `json:"rate"`
	Concurrency     json.RawMessage `json:"concurrency"`
	BreakerFailures json.RawMessage `json:"breaker_failures"`
	BreakerProbe    json.RawMessage `json:"breaker_probe"`
	DisableAfter    json.RawMessage `json:"disable_after"`
	Format          json.RawMessage `json:"format"`
}

// given reports whether raw holds a value (null too).
func given(raw json.RawMessage) bool { return len(raw) > 0 }

// isNull reports whether raw is JSON null.
func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// any reports whether r sets anything.
func (r *endpointRequest) any() bool {
	return given(r.Secret) || given(r.SecretOverlap) || given(r.Headers) || given(r.Timeout) || given(r.RetrySchedule) ||
		given(r.RetryBaseDelay) || given(r.RetryMaxDelay) || given(r.MaxAttempts) || given(r.Rate) || given(r.Concurrency) ||
		given(r.BreakerFailures) || given(r.BreakerProbe) || given(r.DisableAfter) || given(r.Format)
}

// apply sets the fields r gives on ep (null resets one to the server's),
// and returns the change of secret, or answers 400 naming the field.
func (r *endpointRequest) apply(w http.ResponseWriter, ep *delivery.Endpoint) (secret *string, overlap time.Duration, ok bool) {
	str := func(name string, raw json.RawMessage) (string, bool) {
		var v *string
		if err := json.Unmarshal(raw, &v); err != nil {
			writeError(w, api.CodeInvalidJSON, "field %q: want a string or null", name)
			return "", false
		}
		if v == nil {
			return "", true
		}
		if *v == "" {
			writeError(w, api.CodeInvalidField, "%s: empty (null resets it)", name)
			return "", false
		}
		return *v, true
	}
	duration := func(name string, raw json.RawMessage, into *time.Duration) bool {
		if !given(raw) {
			return true
		}
		v, ok := str(name, raw)
		if !ok {
			return false
		}
		if v == "" {
			*into = 0
			return true
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeError(w, api.CodeInvalidField, "%s %q: want a positive duration such as \"30s\"", name, v)
			return false
		}
		*into = d
		return true
	}
	if given(r.Secret) {
		v, ok := str("secret", r.Secret)
		if !ok {
			return nil, 0, false
		}
		secret = &v
	}
	if !duration("secret_overlap", r.SecretOverlap, &overlap) || !duration("timeout", r.Timeout, &ep.Timeout) ||
		!duration("retry_base_delay", r.RetryBaseDelay, &ep.RetryBaseDelay) || !duration("retry_max_delay", r.RetryMaxDelay, &ep.RetryMaxDelay) {
		return nil, 0, false
	}
	if given(r.SecretOverlap) && secret == nil {
		writeError(w, api.CodeInvalidField, "secret_overlap: goes with a new secret")
		return nil, 0, false
	}
	if given(r.Headers) {
		var h map[string]*string
		if err := json.Unmarshal(r.Headers, &h); err != nil {
			writeError(w, api.CodeInvalidJSON, "field \"headers\": want an object of strings or null")
			return nil, 0, false
		}
		ep.Headers = nil // null: none
		if h != nil {
			ep.Headers = make(map[string]string, len(h))
		}
		for k, v := range h {
			if v == nil {
				writeError(w, api.CodeInvalidJSON, "field \"headers\": the value of %.200q: want a string, not null (leave the header out to send none)", k)
				return nil, 0, false
			}
			if !checkAPIText(w, "headers "+strconv.Quote(k), *v, 4096, true) {
				return nil, 0, false
			}
			if hiddenHeader.MatchString(*v) { // what the API answers for a credential, sent back (a form filled from a GET)
				writeError(w, api.CodeInvalidField, "headers %.200q: %q is the fingerprint the API shows for a credential, not its value: give the value itself", k, *v)
				return nil, 0, false
			}
			ep.Headers[k] = *v
		}
	}
	if given(r.RetrySchedule) {
		v, ok := str("retry_schedule", r.RetrySchedule)
		if !ok {
			return nil, 0, false
		}
		ep.RetrySchedule = nil
		if v != "" {
			sched, err := delivery.ParseSchedule(v)
			if err != nil {
				writeError(w, api.CodeInvalidField, "%v", err)
				return nil, 0, false
			}
			ep.RetrySchedule = sched
		}
	}
	// count reads a whole number or null (0) into into; least is the
	// smallest number allowed.
	count := func(name string, raw json.RawMessage, least int, into *int) bool {
		if !given(raw) {
			return true
		}
		var n *int
		if err := json.Unmarshal(raw, &n); err != nil {
			writeError(w, api.CodeInvalidJSON, "field %q: want a whole number or null", name)
			return false
		}
		*into = 0
		if n != nil {
			if *n < least {
				writeError(w, api.CodeInvalidField, "%s %d: want %d or more", name, *n, least)
				return false
			}
			*into = *n
		}
		return true
	}
	if !count("max_attempts", r.MaxAttempts, 1, &ep.MaxAttempts) || !count("concurrency", r.Concurrency, 1, &ep.Concurrency) {
		return nil, 0, false
	}
	if given(r.BreakerFailures) { // 0 turns the breaker off
		if !count("breaker_failures", r.BreakerFailures, 0, &ep.BreakerFailures) {
			return nil, 0, false
		}
		if !isNull(r.BreakerFailures) && ep.BreakerFailures == 0 {
			ep.BreakerFailures = delivery.BreakerOff
		}
	}
	if !duration("breaker_probe", r.BreakerProbe, &ep.BreakerProbe) || !duration("disable_after", r.DisableAfter, &ep.DisableAfter) {
		return nil, 0, false
	}
	if given(r.Rate) {
		v, ok := str("rate", r.Rate)
		if !ok {
			return nil, 0, false
		}
		ep.Rate = delivery.Rate{}
		if v != "" {
			rate, err := delivery.ParseRate(v)
			if err != nil {
				writeError(w, api.CodeInvalidField, "%v", err)
				return nil, 0, false
			}
			ep.Rate = rate
		}
	}
	if given(r.Format) {
		v, ok := str("format", r.Format)
		if !ok {
			return nil, 0, false
		}
		format, err := delivery.ParseFormat(v)
		if err != nil {
			writeError(w, api.CodeInvalidField, "%v", err)
			return nil, 0, false
		}
		ep.Format = format
	}
	return secret, overlap, true
}

// credentialHeader matches the names of headers that carry credentials:
// their values are not answered whole, as secrets are not.
var credentialHeader = regexp.MustCompile(`(?i)^(proxy-)?authorization$|^cookie$|token|secret|password|api-?key|signature`)

// hiddenHeader matches what shownHeader answers for a credential.
var hiddenHeader = regexp.MustCompile(`^\(hidden, [^)]*\)$`)

// shownHeader is what the API answers for an endpoint's header: the value,
// or for a credential its fingerprint, enough to tell which one is set.
func shownHeader(name, value string, fingerprint func(string) string) string {
	if !credentialHeader.MatchString(name) {
		return value
	}
	return "(hidden, " + fingerprint(value) + ")"
}

// newEndpointJSON is the endpoint of sub in the API; null settings are
// the server's.
func newEndpointJSON(sub delivery.Subscription, fingerprint func(string) string) api.Endpoint {
	ep := sub.Endpoint
	j := api.Endpoint{Secrets: []api.Secret{}, Headers: make(map[string]string, len(ep.Headers)), Format: "postbox"}
	if ep.Format != delivery.FormatPostbox {
		j.Format = ep.Format
	}
	for name, value := range ep.Headers {
		j.Headers[name] = shownHeader(name, value, fingerprint)
	}
	for _, s := range sub.Secrets {
		sj := api.Secret{Fingerprint: fingerprint(s.Key), CreatedAt: s.CreatedAt}
		if !s.ExpiresAt.IsZero() {
			t := s.ExpiresAt
			sj.ExpiresAt = &t
		}
		j.Secrets = append(j.Secrets, sj)
	}
	dur := func(d time.Duration) *string {
		if d == 0 {
			return nil
		}
		s := delivery.FormatSchedule([]time.Duration{d})
		return &s
	}
	j.Timeout, j.RetryBaseDelay, j.RetryMaxDelay = dur(ep.Timeout), dur(ep.RetryBaseDelay), dur(ep.RetryMaxDelay)
	if len(ep.RetrySchedule) > 0 {
		s := delivery.FormatSchedule(ep.RetrySchedule)
		j.RetrySchedule = &s
	}
	num := func(n int) *int {
		if n == 0 {
			return nil
		}
		return &n
	}
	j.MaxAttempts, j.Concurrency, j.BreakerFailures = num(ep.MaxAttempts), num(ep.Concurrency), num(ep.BreakerFailures)
	if ep.BreakerFailures == delivery.BreakerOff {
		off := 0
		j.BreakerFailures = &off
	}
	j.BreakerProbe, j.DisableAfter = dur(ep.BreakerProbe), dur(ep.DisableAfter)
	if !ep.Rate.IsZero() {
		r := ep.Rate.String()
		j.Rate = &r
	}
	return j
}

// breakerJSON returns the state of the breaker of inbox's endpoint, nil
// when it cannot be read.
func (s *Server) breakerJSON(r *http.Request, inbox string) *api.Breaker {
	b, err := s.subs.Breaker(r.Context(), inbox)
	if err != nil {
		return nil
	}
	j := &api.Breaker{State: b.State, Failures: b.Failures}
	if !b.Since.IsZero() {
		j.Since = &b.Since
	}
	if b.LastError != "" {
		j.LastError = &b.LastError
	}
	if !b.NextProbe.IsZero() {
		j.NextProbe = &b.NextProbe
	}
	return j
}

// enableSubscription closes the breaker of a subscription's endpoint,
// open or disabled, and answers the subscription.
func (s *Server) enableSubscription(w http.ResponseWriter, r *http.Request) {
	var none struct{} // it takes no body: one with a field is refused
	if !checkName(w, "subscription", r.PathValue("name")) || !decodeBody(w, r, &none, true) {
		return
	}
	if _, err := s.subs.Enable(r.Context(), r.PathValue("name")); err != nil {
		s.writeErr(w, err)
		return
	}
	s.getSubscription(w, r)
}

func (s *Server) listAttempts(w http.ResponseWriter, r *http.Request) {
	inbox, id, ok := itemPath(w, r)
	if !ok {
		return
	}
	log, err := s.inboxes.Attempts(r.Context(), inbox, id)
	if err != nil {
		s.writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.AttemptList{Attempts: attemptsJSON(log)})
}
