package replyto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/postbox-events/postbox/internal/jsonenc"
)

// The handles each kind captures, built here so that their shape is
// written once. Each is compact JSON with "kind" first.

// Default API bases of the providers' presets (a webhook source's
// api_url).
const (
	DefaultGitHubAPI = "https://api.github.com"
	DefaultStripeAPI = "https://api.stripe.com"
)

// CheckAPIURL checks an API base given as a setting (named field): an
// absolute http(s) URL without credentials, query or fragment.
func CheckAPIURL(field, v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s %.200q: want an http:// or https:// URL, e.g. https://api.github.com", field, v)
	}
	if u.User != nil {
		return fmt.Errorf("%s: no credentials in the URL (they would be shown wherever it is): give them in settings.reply.headers", field)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return fmt.Errorf("%s %.200q: an API base, without a query or fragment", field, v)
	}
	return nil
}

// GitHub returns the handle of a GitHub webhook about repo ("owner/name"):
// with issue > 0 (an issue's or a pull request's number), the issue's
// comments endpoint under api (e.g. https://api.github.com) is its url;
// without one it has none.
func GitHub(api, repo string, issue int64) json.RawMessage {
	b := make([]byte, 0, 96+2*len(repo)+len(api))
	b = append(b, `{"kind":"github","repository":`...)
	b = jsonenc.AppendString(b, repo)
	if issue > 0 {
		b = append(b, `,"issue":`...)
		b = strconv.AppendInt(b, issue, 10)
		b = append(b, `,"url":`...)
		b = jsonenc.AppendString(b, strings.TrimRight(api, "/")+"/repos/"+escapePath(repo)+"/issues/"+strconv.FormatInt(issue, 10)+"/comments")
	}
	return append(b, '}')
}

// Stripe returns the handle of a Stripe event about the object of type
// object (e.g. "charge", "checkout.session") and id: its url is the
// object under api, /v1/ and the type pluralised with "s", each "."
// a "/" (api/v1/checkout/sessions/ID). Without a type or an id it has
// no url.
func Stripe(api, object, id string) json.RawMessage {
	b := make([]byte, 0, 96+2*(len(object)+len(id))+len(api))
	b = append(b, `{"kind":"stripe"`...)
	if object != "" {
		b = append(b, `,"object":`...)
		b = jsonenc.AppendString(b, object)
	}
	if id != "" {
		b = append(b, `,"id":`...)
		b = jsonenc.AppendString(b, id)
	}
	if object != "" && id != "" {
		b = append(b, `,"url":`...)
		b = jsonenc.AppendString(b, strings.TrimRight(api, "/")+"/v1/"+escapePath(strings.ReplaceAll(object, ".", "/"))+"s/"+url.PathEscape(id))
	}
	return append(b, '}')
}

// CloudEvents returns the handle of a CloudEvent: its source, and its
// subject when it has one. It has no url.
func CloudEvents(source, subject string) json.RawMessage {
	b := make([]byte, 0, 64+len(source)+len(subject))
	b = append(b, `{"kind":"cloudevents","source":`...)
	b = jsonenc.AppendString(b, source)
	if subject != "" {
		b = append(b, `,"subject":`...)
		b = jsonenc.AppendString(b, subject)
	}
	return append(b, '}')
}

// Webhook returns the handle of a generic webhook whose configured
// header or pointer gave v: its url when v is an absolute http(s) URL,
// else its target.
func Webhook(v string) json.RawMessage {
	b := make([]byte, 0, 48+len(v))
	b = append(b, `{"kind":"webhook",`...)
	if IsURL(v) {
		b = append(b, `"url":`...)
	} else {
		b = append(b, `"target":`...)
	}
	b = jsonenc.AppendString(b, v)
	return append(b, '}')
}

// Device returns the handle of a device's event: its device_id and
// session_id. A reply cannot go to it (Target).
func Device(deviceID, sessionID string) json.RawMessage {
	b := make([]byte, 0, 64+len(deviceID)+len(sessionID))
	b = append(b, `{"kind":"device","device_id":`...)
	b = jsonenc.AppendString(b, deviceID)
	b = append(b, `,"session_id":`...)
	b = jsonenc.AppendString(b, sessionID)
	return append(b, '}')
}

// Of returns the delivery handle of an event or item whose stored
// handle is handle and metadata metadata: the stored handle when it has
// one, else a device's (Device) when the metadata names a device_id (a
// device's event stores none: its handle is derived when read), else
// nil.
func Of(handle, metadata json.RawMessage) json.RawMessage {
	if len(handle) > 0 && !bytes.Equal(handle, []byte("null")) {
		return handle
	}
	if !bytes.Contains(metadata, []byte(`"device_id"`)) { // a webhook's or a poll's: no need to decode
		return nil
	}
	var m struct {
		DeviceID  string `json:"device_id"`
		SessionID string `json:"session_id"`
	}
	if json.Unmarshal(metadata, &m) != nil || m.DeviceID == "" {
		return nil
	}
	return Device(m.DeviceID, m.SessionID)
}

// IsURL reports whether v is an absolute http(s) URL with a host.
func IsURL(v string) bool {
	if !strings.HasPrefix(v, "http://") && !strings.HasPrefix(v, "https://") {
		return false
	}
	u, err := url.Parse(v)
	return err == nil && u.Host != ""
}

// Parse reads the kind and url of a handle (Target takes the result);
// nil or null is the zero Handle.
func Parse(handle json.RawMessage) (Handle, error) {
	var h Handle
	if len(handle) == 0 || bytes.Equal(handle, []byte("null")) {
		return h, nil
	}
	if err := json.Unmarshal(handle, &h); err != nil {
		return h, fmt.Errorf("delivery handle: %w", err)
	}
	if h.Kind == "" {
		return h, errors.New("delivery handle: no kind")
	}
	return h, nil
}

// escapePath escapes each "/"-separated segment of p.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}
