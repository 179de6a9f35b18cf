package replyto_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/postbox-events/postbox/internal/replyto"
)

// TestOf: a stored handle is the handle; without one a device's event
// has the handle its metadata's device_id and session_id make, and any
// other event none.
func TestOf(t *testing.T) {
	for _, c := range []struct{ handle, meta, want string }{
		{`{"kind":"github","repository":"o/r"}`, `{"device_id":"d"}`, `{"kind":"github","repository":"o/r"}`},
		{``, `{"device_id":"dev-1","session_id":"s\"1","schema_version":1}`, `{"kind":"device","device_id":"dev-1","session_id":"s\"1"}`},
		{`null`, `{"session_id": "s", "device_id": "d"}`, `{"kind":"device","device_id":"d","session_id":"s"}`},
		{``, `{"headers":{"device_id":"x"},"remote_addr":"1.2.3.4:5"}`, ``},
		{``, `{"headers":{},"remote_addr":"1.2.3.4:5"}`, ``},
		{``, ``, ``},
	} {
		got := replyto.Of(json.RawMessage(c.handle), json.RawMessage(c.meta))
		if string(got) != c.want {
			t.Errorf("Of(%s, %s) = %s, want %s", c.handle, c.meta, got, c.want)
		}
		if len(got) > 0 && !json.Valid(got) {
			t.Errorf("Of(%s, %s): not JSON", c.handle, c.meta)
		}
	}
	h, err := replyto.Parse(replyto.Device("d", "s"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := replyto.Target(h); !errors.Is(err, replyto.ErrNoURL) {
		t.Errorf("a device's handle: target error %v, want ErrNoURL", err)
	}
}

// TestBuilders: the handles of each kind, escaped.
func TestBuilders(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{string(replyto.GitHub("https://api.github.com/", "o/r b", 5)), `{"kind":"github","repository":"o/r b","issue":5,"url":"https://api.github.com/repos/o/r%20b/issues/5/comments"}`},
		{string(replyto.GitHub("https://api.github.com", "o/r", 0)), `{"kind":"github","repository":"o/r"}`},
		{string(replyto.Stripe("https://api.stripe.com", "issuing.card", "ic/1")), `{"kind":"stripe","object":"issuing.card","id":"ic/1","url":"https://api.stripe.com/v1/issuing/cards/ic%2F1"}`},
		{string(replyto.Stripe("https://api.stripe.com", "", "x")), `{"kind":"stripe","id":"x"}`},
		{string(replyto.CloudEvents("/s", "")), `{"kind":"cloudevents","source":"/s"}`},
		{string(replyto.Webhook("https://x/y")), `{"kind":"webhook","url":"https://x/y"}`},
		{string(replyto.Webhook("http:/nohost")), `{"kind":"webhook","target":"http:/nohost"}`},
	} {
		if c.got != c.want {
			t.Errorf("%s\nwant %s", c.got, c.want)
		}
	}
}
