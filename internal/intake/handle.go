package intake

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/poll"
	"github.com/postbox-events/postbox/internal/replyto"
)

// Delivery handles: where a reply to a webhook's event goes
// (internal/replyto has their shapes). A provider's preset reads it from
// the payload, a generic source from the header or the body's member its
// settings name, a CloudEvent from its source and subject. A source
// without any of these does no work for it.

// handleFunc returns the delivery handle of a webhook whose body (its
// payload: a CloudEvent's data) is valid JSON; nil when it has none. A
// refusal names the setting whose value is wrong.
type handleFunc func(r *http.Request, body []byte) (json.RawMessage, *Refusal)

// maxHandleValue bounds the value a generic source's handle_header or
// handle_pointer reads.
const maxHandleValue = 4096

// Where GitHub's and Stripe's payloads hold what their handles name,
// found by scanning the body (valid JSON), without decoding it.
var (
	ghRepository  = mustPointer("/repository/full_name")
	ghIssue       = mustPointer("/issue/number")
	ghPullRequest = mustPointer("/pull_request/number")
	ghNumber      = mustPointer("/number")
	stripeObject  = mustPointer("/data/object/object")
	stripeID      = mustPointer("/data/object/id")
)

func mustPointer(s string) poll.Pointer {
	p, err := poll.ParsePointer(s)
	if err != nil {
		panic(err)
	}
	return p
}

// findString returns the string body holds at p; "" when none.
func findString(body []byte, p poll.Pointer) string {
	raw, ok, _ := p.Find(body)
	if raw = bytes.TrimSpace(raw); !ok || len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	return scalar(raw)
}

// findNumber returns the positive whole number body holds at p; 0 when
// none.
func findNumber(body []byte, p poll.Pointer) int64 {
	raw, ok, _ := p.Find(body)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// githubHandle reads a GitHub webhook's repository and issue or pull
// request number: issue.number, else pull_request.number, else (a
// pull_request event's) the top-level number. A payload without
// repository.full_name has no handle.
func githubHandle(apiURL string) handleFunc {
	return func(r *http.Request, body []byte) (json.RawMessage, *Refusal) {
		repo := findString(body, ghRepository)
		if repo == "" {
			return nil, nil
		}
		n := findNumber(body, ghIssue)
		if n == 0 {
			n = findNumber(body, ghPullRequest)
		}
		if n == 0 && strings.HasPrefix(r.Header.Get("X-GitHub-Event"), "pull_request") {
			n = findNumber(body, ghNumber)
		}
		return replyto.GitHub(apiURL, repo, n), nil
	}
}

// stripeHandle reads a Stripe event's object: data.object's object and
// id. A payload without either has no handle.
func stripeHandle(apiURL string) handleFunc {
	return func(_ *http.Request, body []byte) (json.RawMessage, *Refusal) {
		object, id := findString(body, stripeObject), findString(body, stripeID)
		if object == "" && id == "" {
			return nil, nil
		}
		return replyto.Stripe(apiURL, object, id), nil
	}
}

// headerHandle reads a generic webhook's handle from the header name
// (canonical); a request without it has none.
func headerHandle(name string) handleFunc {
	return func(r *http.Request, _ []byte) (json.RawMessage, *Refusal) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return nil, nil
		}
		if err := CheckText(name+" header (settings.handle_header)", v, maxHandleValue); err != nil {
			return nil, refuse(api.CodeInvalidField, "%v", err)
		}
		return replyto.Webhook(v), nil
	}
}

// pointerHandle reads a generic webhook's handle from the body's value
// at ptr: a string, or a number's text. A body without one has none; an
// object, array or boolean there is refused.
func pointerHandle(ptr poll.Pointer) handleFunc {
	return func(_ *http.Request, body []byte) (json.RawMessage, *Refusal) {
		raw, ok, _ := ptr.Find(body)
		raw = bytes.TrimSpace(raw)
		if !ok || len(raw) == 0 {
			return nil, nil
		}
		from := "the body's " + ptr.String() + " (settings.handle_pointer)"
		switch raw[0] {
		case '{', '[', 't', 'f':
			return nil, refuse(api.CodeInvalidField, "%s: want a string or a number, the event's delivery handle", from)
		}
		v := strings.TrimSpace(scalar(raw))
		if v == "" {
			return nil, nil // null or empty: none
		}
		if err := CheckText(from, v, maxHandleValue); err != nil {
			return nil, refuse(api.CodeInvalidField, "%v", err)
		}
		return replyto.Webhook(v), nil
	}
}

// cloudEventHandle is a CloudEvent's handle: its source and subject.
func cloudEventHandle(ce *CloudEvent) json.RawMessage {
	subject, _ := ce.attrs["subject"].(string)
	return replyto.CloudEvents(ce.Source, subject)
}
