package poll

import (
	"strings"
	"testing"

	"github.com/postbox-events/postbox/internal/replyto"
)

// TestPollHandle: each item's delivery handle holds what the source's
// handle pointers find in it, in name order, nested or not; a pointer
// that finds nothing (or null) leaves its member out, and an item whose
// pointers all find nothing has none. Without handle settings no item
// has one.
func TestPollHandle(t *testing.T) {
	items := "/events"
	s := Settings{URL: "https://api.example.com/x", Items: &items, ID: "/id", Type: "/type",
		Handle: map[string]string{"url": "/links/reply", "thread": "/thread", "channel": "/meta/chan/0"}}
	p, err := New(Config{Name: "p", Settings: s, Sink: nopSink{}})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"events":[
		{"id":1,"type":"t","links":{"reply":"https://chat.example/r/1"},"thread":{"id": 7, "name": "a b"},"meta":{"chan":["c1","c2"]}},
		{"id":2,"type":"t","thread":"t2","links":null},
		{"id":3,"type":"t","thread":null},
		{"id":4,"type":"t","links":{"reply":"not a url"}},
		{"id":5,"type":"t","thread":"t5","links":{"reply":"https://chat.example/` + strings.Repeat("x", 1100) + `"}}]}`
	pg, err := p.decode([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"kind":"poll","channel":"c1","thread":{"id":7,"name":"a b"},"url":"https://chat.example/r/1"}`,
		`{"kind":"poll","thread":"t2"}`,
		``,
		`{"kind":"poll","url":"not a url"}`,
		`{"kind":"poll","thread":"t5"}`, // the url is over 1 KiB
	}
	if len(pg.events) != len(want) {
		t.Fatalf("%d events, want %d", len(pg.events), len(want))
	}
	for i, ev := range pg.events {
		if string(ev.DeliveryHandle) != want[i] {
			t.Errorf("item %d: handle %s\nwant        %s", i, ev.DeliveryHandle, want[i])
		}
	}
	h, _ := replyto.Parse(pg.events[0].DeliveryHandle)
	if u, err := replyto.Target(h); err != nil || u != "https://chat.example/r/1" {
		t.Errorf("target of the first: %q, %v", u, err)
	}
	h, _ = replyto.Parse(pg.events[3].DeliveryHandle)
	if _, err := replyto.Target(h); err == nil || !strings.Contains(err.Error(), "not an http(s) URL") {
		t.Errorf("target of a handle whose url is none: %v", err)
	}

	s.Handle = nil
	if p, err = New(Config{Name: "p", Settings: s, Sink: nopSink{}}); err != nil {
		t.Fatal(err)
	}
	if pg, err = p.decode([]byte(body)); err != nil {
		t.Fatal(err)
	}
	for i, ev := range pg.events {
		if ev.DeliveryHandle != nil {
			t.Errorf("item %d without handle settings: handle %s", i, ev.DeliveryHandle)
		}
	}
}

// TestPollHandleSettings: a handle setting that is wrong is named.
func TestPollHandleSettings(t *testing.T) {
	items := ""
	for _, c := range []struct {
		handle map[string]string
		want   string
	}{
		{map[string]string{"url": "reply"}, `settings.handle.url: JSON pointer "reply": starts with /`},
		{map[string]string{"url": "/a~"}, `settings.handle.url: JSON pointer "/a~": ~ must be followed by 0`},
		{map[string]string{"thread": ""}, `settings.handle.thread: a JSON pointer into each item`},
		{map[string]string{"kind": "/k"}, `settings.handle.kind: the handle's kind is "poll"`},
		{map[string]string{"": "/k"}, `settings.handle: member name "": want 1 to 64 bytes`},
		{map[string]string{"a\nb": "/k"}, `settings.handle: member name "a\nb": holds a control character`},
	} {
		s := Settings{URL: "https://api.example.com/x", Items: &items, ID: "/id", Type: "/type", Handle: c.handle}
		if err := s.Validate(); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.handle, err, c.want)
		}
	}
	s := Settings{URL: "https://api.example.com/x", Items: &items, ID: "/id", Type: "/type", Reply: &replyto.Settings{Headers: map[string]string{"Host": "x"}}}
	if err := s.Validate(); err == nil || !strings.HasPrefix(err.Error(), "settings.reply.headers: Host is set by postbox") {
		t.Errorf("reply: %v", err)
	}
	s.Reply = &replyto.Settings{Headers: map[string]string{"Authorization": "Bearer x", "X-Env": "env:T"}}
	r := s.Redacted(func(string) string { return "fp" })
	if r.Reply.Headers["Authorization"] != "fp" || r.Reply.Headers["X-Env"] != "env:T" || s.Reply.Headers["Authorization"] != "Bearer x" {
		t.Errorf("redacted reply %v (of %v)", r.Reply.Headers, s.Reply.Headers)
	}
}
