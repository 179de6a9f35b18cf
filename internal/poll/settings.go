package poll

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox/internal/redirect"
	"github.com/postbox-events/postbox/internal/replyto"
)

// Bounds of Settings.
const (
	// DefaultInterval is how long the poller waits between polls when
	// the last one brought nothing new.
	DefaultInterval = 5 * time.Second
	// MinInterval and MaxInterval bound Settings.Interval.
	MinInterval = 10 * time.Millisecond
	MaxInterval = 24 * time.Hour
	maxHeaders  = 20
	// maxHandleMembers bounds Settings.Handle.
	maxHandleMembers = 16
)

// Settings are the settings of a source of kind poll, as its JSON
// settings hold them.
type Settings struct {
	// URL is the API polled with GET: http(s)://…; its query is kept.
	URL string `json:"url"`
	// Items points (RFC 6901) at the array of items in each answer; ""
	// when the answer is the array. Required (give "" as "/" is a member
	// named "").
	Items *string `json:"items"`
	// ID points at each item's id within the item: a string or a number,
	// the event's native id. Required.
	ID string `json:"id"`
	// Type points at each item's type: a string. Required.
	Type string `json:"type"`
	// Time points at each item's time: an RFC 3339 string, or a number of
	// seconds (milliseconds above 1e12) since 1970. Optional: without it
	// the event's time is when it was polled.
	Time string `json:"time,omitempty"`
	// CursorParam is the query parameter the cursor goes back in, and
	// Next points at the next cursor in each answer; both or neither.
	// Without them every poll asks for URL as it is.
	CursorParam string `json:"cursor_param,omitempty"`
	Next        string `json:"next,omitempty"`
	// Interval is the wait between polls when the last one brought no
	// new page, e.g. "5s". Defaults to DefaultInterval.
	Interval string `json:"interval,omitempty"`
	// Headers are sent with each request. A value "env:NAME" is read from
	// the environment variable NAME at each poll and is never stored.
	Headers map[string]string `json:"headers,omitempty"`
	// Redirects says which redirects a poll follows: "same-origin" (the
	// default, "") only to the URL's scheme, host and port, "none" none.
	// Headers never go to another origin.
	Redirects string `json:"redirects,omitempty"`
	// Handle makes each item's delivery handle (internal/replyto):
	// member name → JSON pointer into the item. The handle is
	// {"kind":"poll", name: the value found, ...}, its members in name
	// order; a member named "url" is where a reply goes. A pointer that
	// finds nothing (or null) leaves its member out, and an item whose
	// pointers find nothing has no handle. None: items have no handle.
	Handle map[string]string `json:"handle,omitempty"`
	// Reply holds what a reply to the source's events carries.
	Reply *replyto.Settings `json:"reply,omitempty"`
}

// ErrRequired is in the error of Validate for a setting that is missing.
var ErrRequired = errors.New("required")

// Validate names the setting that is wrong. It leaves s as it is.
func (s Settings) Validate() error {
	u, err := url.Parse(s.URL)
	if s.URL == "" {
		return fmt.Errorf("settings.url: %w (the API to poll, http(s)://…)", ErrRequired)
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("settings.url %.200q: want an http:// or https:// URL", s.URL)
	}
	if u.User != nil {
		return errors.New("settings.url: no credentials in the URL (they would be shown wherever it is): send them in settings.headers, as env:NAME to keep them out of the stored settings")
	}
	if s.Items == nil {
		return fmt.Errorf("settings.items: %w: a JSON pointer to the array of items in each answer, e.g. /events (\"\" when the answer is the array)", ErrRequired)
	}
	if s.ID == "" {
		return fmt.Errorf("settings.id: %w: a JSON pointer to each item's id, e.g. /id", ErrRequired)
	}
	if s.Type == "" {
		return fmt.Errorf("settings.type: %w: a JSON pointer to each item's type, e.g. /type", ErrRequired)
	}
	for _, p := range []struct{ name, v string }{
		{"items", *s.Items}, {"id", s.ID}, {"type", s.Type}, {"time", s.Time}, {"next", s.Next},
	} {
		if _, err := ParsePointer(p.v); err != nil {
			return fmt.Errorf("settings.%s: %w", p.name, err)
		}
	}
	if (s.CursorParam == "") != (s.Next == "") {
		return errors.New("settings.cursor_param and settings.next go together: the cursor read at next goes back in the query parameter cursor_param")
	}
	if s.CursorParam != "" && strings.ContainsAny(s.CursorParam, "&=#?") {
		return fmt.Errorf("settings.cursor_param %q: a query parameter name (no & = # ?)", s.CursorParam)
	}
	if _, err := s.interval(); err != nil {
		return err
	}
	if err := redirect.Validate("settings.redirects", s.Redirects); err != nil {
		return err
	}
	if err := s.validateHandle(); err != nil {
		return err
	}
	if s.Reply != nil {
		if err := s.Reply.Validate("settings.reply"); err != nil {
			return err
		}
	}
	if len(s.Headers) > maxHeaders {
		return fmt.Errorf("settings.headers: %d headers, at most %d", len(s.Headers), maxHeaders)
	}
	for name, v := range s.Headers {
		if !validHeaderName(name) {
			return fmt.Errorf("settings.headers: %q is not a header name", name)
		}
		if env, ok := strings.CutPrefix(v, "env:"); ok && env == "" {
			return fmt.Errorf("settings.headers.%s: env: names no variable", name)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("settings.headers.%s: a header value holds no line breaks", name)
		}
	}
	return nil
}

// validateHandle checks Handle: names and pointers.
func (s Settings) validateHandle() error {
	if len(s.Handle) > maxHandleMembers {
		return fmt.Errorf("settings.handle: %d members, at most %d", len(s.Handle), maxHandleMembers)
	}
	for name, ptr := range s.Handle {
		switch {
		case name == "" || len(name) > 64:
			return fmt.Errorf("settings.handle: member name %.80q: want 1 to 64 bytes", name)
		case name == "kind":
			return errors.New(`settings.handle.kind: the handle's kind is "poll"; name the member otherwise`)
		}
		for _, c := range name {
			if c < 0x20 || c == 0x7f || c == utf8.RuneError {
				return fmt.Errorf("settings.handle: member name %q: holds a control character or invalid UTF-8", name)
			}
		}
		if ptr == "" {
			return fmt.Errorf("settings.handle.%s: a JSON pointer into each item, e.g. /reply_url (not \"\", the whole item)", name)
		}
		if _, err := ParsePointer(ptr); err != nil {
			return fmt.Errorf("settings.handle.%s: %w", name, err)
		}
	}
	return nil
}

// interval returns Interval as a duration, DefaultInterval when empty.
func (s Settings) interval() (time.Duration, error) {
	if s.Interval == "" {
		return DefaultInterval, nil
	}
	d, err := time.ParseDuration(s.Interval)
	if err != nil || d < MinInterval || d > MaxInterval {
		return 0, fmt.Errorf("settings.interval %q: want a duration from %v to %v, e.g. 5s", s.Interval, MinInterval, MaxInterval)
	}
	return d, nil
}

// ParseHeader reads a --header value "Name: value" (or "Name: env:VAR").
func ParseHeader(h string) (name, value string, _ error) {
	name, value, ok := strings.Cut(h, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	if !ok || !validHeaderName(name) {
		return "", "", fmt.Errorf("header %q: want 'Name: value' or 'Name: env:VARIABLE'", h)
	}
	return http.CanonicalHeaderKey(name), value, nil
}

// Redacted returns s with its header values that are not env:NAME
// replaced by fingerprints, for the API: what the environment holds is
// never in the settings, and what the settings hold is not shown.
func (s Settings) Redacted(fingerprint func(string) string) Settings {
	if s.Reply != nil {
		r := s.Reply.Redacted(fingerprint)
		s.Reply = &r
	}
	if len(s.Headers) == 0 {
		return s
	}
	h := make(map[string]string, len(s.Headers))
	for k, v := range s.Headers {
		if !strings.HasPrefix(v, "env:") {
			v = fingerprint(v)
		}
		h[k] = v
	}
	s.Headers = h
	return s
}

// header builds the request headers, reading env:NAME values with
// lookup; a variable that is not set is an error naming it.
func (s Settings) header(lookup func(string) (string, bool)) (http.Header, error) {
	return replyto.EnvHeader(s.Headers, lookup)
}

// DecodeSettings decodes a source's stored or requested settings,
// refusing unknown fields, and validates them.
func DecodeSettings(raw json.RawMessage) (Settings, error) {
	var s Settings
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("settings: %w", err)
	}
	return s, s.Validate()
}

// validHeaderName reports whether v is an HTTP header name (a token).
func validHeaderName(v string) bool {
	if v == "" || len(v) > 128 {
		return false
	}
	for _, c := range []byte(v) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
