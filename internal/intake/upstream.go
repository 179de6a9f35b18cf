package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/names"
	"github.com/postbox-events/postbox/internal/poll"
)

// ErrRequired is in the error of UpstreamSettings for a setting that is
// missing (the API's missing_field).
var ErrRequired = errors.New("required")

// requiredError is a message naming a missing setting, of kind
// ErrRequired.
type requiredError struct{ msg string }

func (e *requiredError) Error() string { return e.msg }
func (e *requiredError) Unwrap() error { return ErrRequired }

// UpstreamSettings checks the settings a request gives a source of kind
// poll or feed and returns them as stored, or an error naming the field.
// decode decodes raw into the kind's settings (the API's strict
// decoding; its errors are returned as they are); checkURL checks the URL
// the source reads (netpolicy.Policy.CheckURL). A missing setting is an
// error of kind ErrRequired.
func UpstreamSettings(kind string, raw json.RawMessage, decode func(raw []byte, v any) error, checkURL func(field, url string) error) (json.RawMessage, error) {
	if len(raw) == 0 {
		return nil, &requiredError{"settings: required: the upstream to read (for poll: url, items, id, type; for feed: url)"}
	}
	var s interface{ Validate() error }
	var url *string // the settings' url, which checkURL checks
	switch kind {
	case KindPoll:
		p := &poll.Settings{}
		s, url = p, &p.URL
	case KindFeed:
		f := &feed.Settings{}
		s, url = f, &f.URL
	default:
		return nil, fmt.Errorf("kind %q reads nothing upstream", kind)
	}
	if err := decode(raw, s); err != nil {
		return nil, err
	}
	if err := s.Validate(); errors.Is(err, poll.ErrRequired) || errors.Is(err, feed.ErrRequired) {
		return nil, &requiredError{err.Error()}
	} else if err != nil {
		return nil, err
	}
	if f, ok := s.(*feed.Settings); ok && !names.Valid(f.StreamName()) {
		return nil, fmt.Errorf("settings.url %.200q: the stream's name: %s", f.URL, names.Rule)
	}
	if err := checkURL("settings.url", *url); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// UpstreamSettingsJSON returns a poll or feed source's settings as the
// API shows them: header values and a token that are not env:NAME as
// fingerprints.
func UpstreamSettingsJSON(src Source, fingerprint func(string) string) json.RawMessage {
	switch src.Kind {
	case KindPoll:
		var s poll.Settings
		if json.Unmarshal(src.Settings, &s) == nil {
			b, _ := json.Marshal(s.Redacted(fingerprint))
			return b
		}
	case KindFeed:
		var s feed.Settings
		if json.Unmarshal(src.Settings, &s) == nil {
			if s.Token != "" && !bytes.HasPrefix([]byte(s.Token), []byte("env:")) {
				s.Token = fingerprint(s.Token)
			}
			if s.Reply != nil {
				r := s.Reply.Redacted(fingerprint)
				s.Reply = &r
			}
			b, _ := json.Marshal(s)
			return b
		}
	}
	return json.RawMessage(`{}`)
}
