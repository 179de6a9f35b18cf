package delivery_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/stream"
)

// replyTarget answers the replies it is sent with the statuses given, the
// last one repeating, and keeps what it was sent.
type replyTarget struct {
	*httptest.Server
	mu       sync.Mutex
	statuses []int
	got      []*http.Request
	bodies   []string
}

func newReplyTarget(t *testing.T, statuses ...int) *replyTarget {
	rt := &replyTarget{statuses: statuses}
	rt.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rt.mu.Lock()
		n := min(len(rt.got), len(rt.statuses)-1)
		rt.got, rt.bodies = append(rt.got, r), append(rt.bodies, string(body))
		rt.mu.Unlock()
		w.WriteHeader(rt.statuses[n])
		io.WriteString(w, `{"answer":"from the target"}`)
	}))
	t.Cleanup(rt.Close)
	return rt
}

// replyItem appends an event with handle (none: nil) and metadata to the
// devices stream and returns the item inbox "replies" made of it.
func (e *env) replyItem(t *testing.T, id string, handle, meta string) delivery.Item {
	t.Helper()
	ev := stream.Event{NativeID: id, Type: "t", OccurredAt: time.Now(), Metadata: json.RawMessage(meta), Payload: json.RawMessage(`{}`)}
	if handle != "" {
		ev.DeliveryHandle = json.RawMessage(handle)
	}
	res, err := e.streams.Append(context.Background(), "devices", []stream.Event{ev})
	if err != nil || res[0].Err != nil {
		t.Fatalf("append %s: %v %+v", id, err, res)
	}
	var it delivery.Item
	testenv.Eventually(t, 30*time.Second, "the item of "+id, func() bool {
		var err error
		it, err = e.d.ItemOf(context.Background(), "replies", res[0].Offset)
		return err == nil
	})
	return it
}

// waitReply waits until the reply of key to it is in state with logged
// attempts logged.
func (e *env) waitReply(t *testing.T, it delivery.Item, key, state string, logged int) delivery.Reply {
	t.Helper()
	var got delivery.Reply
	testenv.Eventually(t, 30*time.Second, "reply "+key+" to be "+state, func() bool {
		rs, err := e.d.Replies(context.Background(), it.Inbox, it.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.Key == key {
				got = r
				// A reply is read before its log: a reply read in its
				// attempt (pending, no error yet) may come with the log
				// its settle wrote.
				return r.State == state && len(r.Log) == logged && (state != delivery.ReplyPending || r.LastError != "")
			}
		}
		return false
	})
	return got
}

// TestReplies: a reply goes to the url of its item's delivery handle with
// its source's reply headers (an env: value read at the attempt) and
// signature, is retried after a 503 on the server's backoff with each
// attempt logged, is stored once per key (the same body again is the same
// reply, another body a conflict), and becomes a dead letter after its
// last attempt, which RetryReply sends again. Events whose handle names
// no url, and devices', are refused with the reason.
func TestReplies(t *testing.T) { eachStore(t, testReplies) }

func testReplies(t *testing.T, kind storeKind) {
	env := map[string]string{"GH_TOKEN": "Bearer t0ken"}
	var origins atomic.Value // []string: where the headers may go for handles whose url comes with the event
	origins.Store([]string(nil))
	e := setup(t, kind, delivery.Config{RetryBaseDelay: time.Second, RetryMaxDelay: time.Second, Jitter: retry.NoJitter, MaxAttempts: 2,
		ReplySettings: func(_ context.Context, source string) (replyto.Settings, error) {
			if source != "devices" {
				return replyto.Settings{}, errors.New("asked for the settings of " + source)
			}
			return replyto.Settings{Headers: map[string]string{"Authorization": "env:GH_TOKEN"}, SigningSecret: secretA,
				Origins: origins.Load().([]string)}, nil
		},
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	})
	e.create(t, delivery.Subscription{Name: "replies", Source: "devices"})
	ctx := context.Background()
	gh := newReplyTarget(t, http.StatusServiceUnavailable, http.StatusCreated)
	it := e.replyItem(t, "issue-1", `{"kind":"github","repository":"o/r","issue":1,"url":"`+gh.URL+`/repos/o/r/issues/1/comments"}`, `{}`)

	r, made, err := e.d.Reply(ctx, it.Inbox, it.ID, "thanks", json.RawMessage(` {"body": "Thanks!"} `))
	if err != nil || !made || r.State != delivery.ReplyPending || string(r.Body) != `{"body":"Thanks!"}` {
		t.Fatalf("Reply: %+v made=%v %v", r, made, err)
	}
	again, made, err := e.d.Reply(ctx, it.Inbox, it.ID, "thanks", json.RawMessage(`{"body":"Thanks!"}`))
	if err != nil || made || again.ID != r.ID {
		t.Fatalf("the same reply again: %+v made=%v %v, want reply %d", again, made, err, r.ID)
	}
	if _, _, err := e.d.Reply(ctx, it.Inbox, it.ID, "thanks", json.RawMessage(`{"body":"Other"}`)); !errors.Is(err, delivery.ErrConflict) {
		t.Fatalf("another body under the key: %v, want ErrConflict", err)
	}
	first := e.waitReply(t, it, "thanks", delivery.ReplyPending, 1)
	if first.Attempts != 1 || !strings.Contains(first.LastError, "503") {
		t.Fatalf("after a 503: %+v", first)
	}
	e.clock.Advance(2 * time.Second)
	done := e.waitReply(t, it, "thanks", delivery.ReplyCompleted, 2)
	if len(done.Log) != 2 || done.Log[0].Status != 503 || done.Log[1].Status != 201 || done.Log[1].Excerpt != `{"answer":"from the target"}` {
		t.Fatalf("attempt log: %+v", done.Log)
	}
	gh.mu.Lock()
	for i, req := range gh.got {
		if req.URL.Path != "/repos/o/r/issues/1/comments" || req.Method != http.MethodPost || req.Header.Get("Authorization") != "Bearer t0ken" ||
			gh.bodies[i] != `{"body":"Thanks!"}` || req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %d: %s %s %v %s", i, req.Method, req.URL, req.Header, gh.bodies[i])
		}
		if err := verify(secretA, req.Header, []byte(gh.bodies[i]), e.clock.Now()); err != nil || req.Header.Get("webhook-id") != req.Header.Get("Idempotency-Key") {
			t.Errorf("request %d: signature: %v (%v)", i, err, req.Header)
		}
	}
	gh.mu.Unlock()

	// A key's reply is kept: asked again after it went, it is the same.
	if again, made, err := e.d.Reply(ctx, it.Inbox, it.ID, "thanks", json.RawMessage(`{"body":"Thanks!"}`)); err != nil || made || again.State != delivery.ReplyCompleted {
		t.Fatalf("the reply again after it went: %+v made=%v %v", again, made, err)
	}

	// A target that always fails: a dead letter after MaxAttempts, sent
	// again by RetryReply.
	down := newReplyTarget(t, http.StatusInternalServerError, http.StatusInternalServerError, http.StatusOK)
	it2 := e.replyItem(t, "issue-2", `{"kind":"webhook","url":"`+down.URL+`/hook"}`, `{}`)
	// A webhook handle's url comes with the event: the source's headers go
	// there only when its origin is among the reply settings' origins.
	if _, _, err := e.d.Reply(ctx, it2.Inbox, it2.ID, "", json.RawMessage(`{"ok":true}`)); !errors.Is(err, delivery.ErrInvalid) ||
		!strings.Contains(err.Error(), "settings.reply.origins") {
		t.Fatalf("a reply with headers to an origin not listed: %v, want ErrInvalid naming settings.reply.origins", err)
	}
	origins.Store([]string{"https://elsewhere.example", down.URL})
	if _, _, err := e.d.Reply(ctx, it2.Inbox, it2.ID, "", json.RawMessage(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	key := delivery.ReplyKey([]byte(`{"ok":true}`))
	e.waitReply(t, it2, key, delivery.ReplyPending, 1)
	e.clock.Advance(2 * time.Second)
	dead := e.waitReply(t, it2, key, delivery.ReplyFailed, 2)
	if dead.Attempts != 2 || len(dead.Log) != 2 {
		t.Fatalf("dead letter: %+v", dead)
	}
	if _, err := e.d.RetryReply(ctx, it.Inbox, it.ID, "thanks"); !errors.Is(err, delivery.ErrInvalidState) {
		t.Fatalf("RetryReply of a completed reply: %v, want ErrInvalidState", err)
	}
	// Pending with a fresh count (the loop may have taken it already).
	if r, err := e.d.RetryReply(ctx, it2.Inbox, it2.ID, key); err != nil || r.State == delivery.ReplyFailed || r.Attempts > 1 {
		t.Fatalf("RetryReply: %+v %v", r, err)
	}
	e.waitReply(t, it2, key, delivery.ReplyCompleted, 3)

	// A reply goes with its item.
	if _, err := e.d.DiscardItem(ctx, it2.Inbox, it2.ID); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, `SELECT count(*) FROM replies WHERE item_id = ?`, it2.ID); n != 0 {
		t.Errorf("%d replies of a discarded item left", n)
	}
	if n := e.count(t, `SELECT count(*) FROM reply_attempts`); n != 2 {
		t.Errorf("%d reply attempts left, want the 2 of the first item's reply", n)
	}

	// Handles a reply cannot go to.
	for _, c := range []struct{ id, handle, meta, want string }{
		{"none", "", `{}`, "no delivery handle"},
		{"device", "", `{"device_id":"pi-1","session_id":"s"}`, "device"},
		{"cloudevents", `{"kind":"cloudevents","source":"/x"}`, `{}`, "names no url"},
		{"ftp", `{"kind":"webhook","url":"ftp://example.com/x"}`, `{}`, "not an http(s) URL"},
	} {
		it := e.replyItem(t, c.id, c.handle, c.meta)
		if _, _, err := e.d.Reply(ctx, it.Inbox, it.ID, "", json.RawMessage(`{}`)); !errors.Is(err, delivery.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("reply to %s: %v, want ErrInvalid saying %q", c.id, err, c.want)
		}
	}
	for _, c := range []struct{ key, body, want string }{
		{"k", ``, "body: required"},
		{"k", `{"a":`, "not valid JSON"},
		{"k\n", `{}`, "key"},
		{strings.Repeat("k", 201), `{}`, "key"},
	} {
		if _, _, err := e.d.Reply(ctx, it.Inbox, it.ID, c.key, json.RawMessage(c.body)); !errors.Is(err, delivery.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("reply %q %q: %v, want ErrInvalid saying %q", c.key, c.body, err, c.want)
		}
	}
	if _, _, err := e.d.Reply(ctx, it.Inbox, 99999, "", json.RawMessage(`{}`)); !errors.Is(err, delivery.ErrNotFound) {
		t.Errorf("reply to no item: %v, want ErrNotFound", err)
	}
}

// TestReplySlowTarget: a reply whose target hangs holds one reply worker;
// a reply to another target goes meanwhile.
func TestReplySlowTarget(t *testing.T) {
	e := setup(t, sqliteStore, delivery.Config{})
	e.create(t, delivery.Subscription{Name: "replies", Source: "devices"})
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) })
	fast := newReplyTarget(t, http.StatusOK)
	ctx := context.Background()
	a := e.replyItem(t, "slow", `{"kind":"webhook","url":"`+slow.URL+`"}`, `{}`)
	if _, _, err := e.d.Reply(ctx, a.Inbox, a.ID, "k", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the slow reply to be in its attempt", func() bool {
		rs, _ := e.d.Replies(ctx, a.Inbox, a.ID)
		return len(rs) == 1 && rs[0].Attempts == 1
	})
	b := e.replyItem(t, "fast", `{"kind":"webhook","url":"`+fast.URL+`"}`, `{}`)
	if _, _, err := e.d.Reply(ctx, b.Inbox, b.ID, "k", json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	e.waitReply(t, b, "k", delivery.ReplyCompleted, 1)
}
