package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// The console's acts, each driven from its page in the browser and
// checked through the API: what the page did is what the server holds.

// fill sets the inputs of the form sel: name → value.
func fill(t *testing.T, ctx context.Context, form string, values map[string]string) {
	t.Helper()
	b, _ := json.Marshal(values)
	do(t, ctx, "fill "+form, chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const f = document.querySelector(%q);
		for (const [k, v] of Object.entries(%s)) f.querySelector('[name="' + k + '"]').value = v;
	})()`, form, b)))
}

// confirm clicks sel and then the confirm dialog's OK.
func confirm(t *testing.T, ctx context.Context, what, sel string) {
	t.Helper()
	do(t, ctx, what, chromedp.Click(chromedp.CSS(sel)), chromedp.WaitVisible(chromedp.CSS(`#confirm-dialog[open]`)), chromedp.Click(chromedp.CSS(`#confirm-ok`)))
}

// target is an endpoint that records the requests it takes and answers
// 200, or 503 while down is set.
type target struct {
	*httptest.Server
	mu   sync.Mutex
	got  []*http.Request
	down bool
}

func newTarget(t *testing.T) *target {
	tg := &target{}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		defer tg.mu.Unlock()
		tg.got = append(tg.got, r)
		if tg.down {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"received":true}`))
	}))
	t.Cleanup(tg.Close)
	return tg
}

// subscriptionOf reads subscription name from the API.
func subscriptionOf(t *testing.T, srv *servertest.Server, name string) map[string]any {
	t.Helper()
	var s map[string]any
	call(t, srv, "", "GET", "/v1/subscriptions/"+name, nil, http.StatusOK, &s)
	return s
}

// TestCreateEditDeleteSubscription creates a subscription and its
// endpoint from the form, sees a refusal of the API on the page, edits
// the endpoint's settings and deletes the subscription.
func TestCreateEditDeleteSubscription(t *testing.T) {
	tg := newTarget(t)
	srv := servertest.Start(t, server.Config{}, nil)
	ctx := tab(t, 1280, 900)
	ui := srv.Base + "/ui/"

	do(t, ctx, "subscriptions", chromedp.Navigate(ui+"#/subscriptions"), chromedp.Click(chromedp.CSS(`#new-subscription`)),
		chromedp.WaitVisible(chromedp.CSS(`#subscription-form`)))
	// A target the API refuses: its error is on the page, nothing is made.
	fill(t, ctx, "#subscription-form", map[string]string{"name": "orders", "types": "order.*, refund.created", "target": "ftp://example.com/in"})
	do(t, ctx, "submit", chromedp.Click(chromedp.CSS(`#subscription-form button[type=submit]`)))
	wait(t, ctx, "the API's refusal", `document.querySelector('#form-error .error') !== null`)
	if got := text(t, ctx, `#form-error`); !strings.Contains(got, "400 invalid_field") || !strings.Contains(got, "target") {
		t.Errorf("the refusal shown is %q, want 400 invalid_field naming the target", got)
	}
	call(t, srv, "", "GET", "/v1/subscriptions/orders", nil, http.StatusNotFound, nil)

	fill(t, ctx, "#subscription-form", map[string]string{"target": tg.URL, "headers": "X-Team: ops\nX-Env: test", "max_attempts": "3",
		"retry_schedule": "5s,1m", "start": "earliest"})
	do(t, ctx, "submit", chromedp.Click(chromedp.CSS(`#subscription-form button[type=submit]`)))
	wait(t, ctx, "the new subscription's page", `document.querySelector('#sub-note') !== null`)
	shot(t, ctx, "subscription")
	s := subscriptionOf(t, srv, "orders")
	if s["target"] != tg.URL || fmt.Sprint(s["types"]) != "[order.* refund.created]" || fmt.Sprint(s["headers"]) != "map[X-Env:test X-Team:ops]" ||
		fmt.Sprint(s["max_attempts"]) != "3" || s["retry_schedule"] != "5s,1m" || s["start"] != "earliest" {
		t.Errorf("created from the form: %v", s)
	}

	// Edit: a timeout set, max attempts back to the default, headers as
	// they were (not sent again).
	fill(t, ctx, "#endpoint-form", map[string]string{"timeout": "7s", "max_attempts": ""})
	do(t, ctx, "save", chromedp.Click(chromedp.CSS(`#endpoint-form button[type=submit]`)))
	wait(t, ctx, "saved", `document.querySelector('#sub-note') && document.querySelector('#sub-note').textContent === 'Saved.'`)
	s = subscriptionOf(t, srv, "orders")
	if s["timeout"] != "7s" || s["max_attempts"] != nil || fmt.Sprint(s["headers"]) != "map[X-Env:test X-Team:ops]" || s["retry_schedule"] != "5s,1m" {
		t.Errorf("after the edit: %v", s)
	}
	// A credential header is shown as its fingerprint; sending that back
	// is refused, and the credential stays.
	call(t, srv, "", "PATCH", "/v1/subscriptions/orders", map[string]any{"headers": map[string]string{"Authorization": "Bearer s3cret", "X-Team": "ops"}}, http.StatusOK, nil)
	do(t, ctx, "reload", chromedp.Reload())
	wait(t, ctx, "the endpoint form", `document.querySelector('#endpoint-form [name=headers]') !== null`)
	do(t, ctx, "add a header", chromedp.Evaluate[chromedp.Void](`(() => { const h = document.querySelector('#endpoint-form [name=headers]'); h.value += '\nX-Env: prod'; })()`),
		chromedp.Click(chromedp.CSS(`#endpoint-form button[type=submit]`)))
	wait(t, ctx, "the refusal", `document.querySelector('#endpoint-error .error') !== null`)
	if got := text(t, ctx, `#endpoint-error`); !strings.Contains(got, "Authorization") || !strings.Contains(got, "fingerprint") {
		t.Errorf("the refusal of a hidden header sent back: %q", got)
	}
	if s := subscriptionOf(t, srv, "orders"); !strings.HasPrefix(fmt.Sprint(s["headers"].(map[string]any)["Authorization"]), "(hidden, ") || s["headers"].(map[string]any)["X-Env"] != nil {
		t.Errorf("the headers changed: %v", s["headers"])
	}

	// A setting the API refuses.
	do(t, ctx, "reload", chromedp.Reload())
	wait(t, ctx, "the endpoint form", `document.querySelector('#endpoint-form [name=rate]') !== null`)
	fill(t, ctx, "#endpoint-form", map[string]string{"rate": "fast"})
	do(t, ctx, "save", chromedp.Click(chromedp.CSS(`#endpoint-form button[type=submit]`)))
	wait(t, ctx, "the refusal", `document.querySelector('#endpoint-error .error') !== null`)
	if got := text(t, ctx, `#endpoint-error`); !strings.Contains(got, "rate") {
		t.Errorf("the refusal of rate fast: %q", got)
	}

	confirm(t, ctx, "delete", `#delete-btn`)
	wait(t, ctx, "the subscriptions list", `location.hash === '#/subscriptions' && document.body.dataset.page === 'subscriptions'`)
	call(t, srv, "", "GET", "/v1/subscriptions/orders", nil, http.StatusNotFound, nil)
}

// TestRotateSecret rotates an endpoint's signing secret from its page:
// the old one stays valid beside the new one for the overlap.
func TestRotateSecret(t *testing.T) {
	tg := newTarget(t)
	srv := servertest.Start(t, server.Config{}, nil)
	call(t, srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "signed", "source": "webhooks", "target": tg.URL,
		"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, http.StatusCreated, nil)
	before := subscriptionOf(t, srv, "signed")["secrets"].([]any)[0].(map[string]any)["fingerprint"]
	ctx := tab(t, 1280, 900)
	do(t, ctx, "the subscription", chromedp.Navigate(srv.Base+"/ui/#/subscription/signed"), chromedp.WaitVisible(chromedp.CSS(`#secret-form`)))

	fill(t, ctx, "#secret-form", map[string]string{"secret": "not-a-secret"})
	do(t, ctx, "rotate to a bad secret", chromedp.Click(chromedp.CSS(`#secret-form button[type=submit]`)))
	wait(t, ctx, "the refusal", `document.querySelector('#secret-error .error') !== null`)
	if got := text(t, ctx, `#secret-error`); !strings.Contains(got, "secret") {
		t.Errorf("the refusal of a bad secret: %q", got)
	}

	do(t, ctx, "generate and rotate", chromedp.Click(chromedp.CSS(`#generate-secret`)))
	fill(t, ctx, "#secret-form", map[string]string{"overlap": "2h"})
	do(t, ctx, "rotate", chromedp.Click(chromedp.CSS(`#secret-form button[type=submit]`)))
	wait(t, ctx, "rotated", `document.querySelector('#sub-note') && document.querySelector('#sub-note').textContent === 'Secret rotated.'`)
	secrets := subscriptionOf(t, srv, "signed")["secrets"].([]any)
	if len(secrets) != 2 || secrets[0].(map[string]any)["fingerprint"] == before || secrets[1].(map[string]any)["fingerprint"] != before ||
		secrets[1].(map[string]any)["expires_at"] == nil {
		t.Fatalf("secrets after the rotation: %v", secrets)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#secrets-table tbody tr').length`)); n != 2 {
		t.Errorf("the page shows %d secrets, want 2", n)
	}
}

// TestPauseResume pauses and resumes a subscription from the list and
// from its page, and sees nothing delivered while it is paused.
func TestPauseResume(t *testing.T) {
	tg := newTarget(t)
	srv := servertest.Start(t, server.Config{}, nil)
	call(t, srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "hooks", "source": "webhooks", "target": tg.URL}, http.StatusCreated, nil)
	ctx := tab(t, 1280, 900)
	ui := srv.Base + "/ui/"

	do(t, ctx, "subscriptions", chromedp.Navigate(ui+"#/subscriptions"), chromedp.WaitVisible(chromedp.CSS(`#subscriptions-table tr[data-name=hooks] button.pause`)))
	confirm(t, ctx, "pause", `#subscriptions-table tr[data-name=hooks] button.pause`)
	wait(t, ctx, "hooks paused", `document.querySelector('#subscriptions-table tr[data-name=hooks][data-paused=true] button.resume') !== null`)
	if s := subscriptionOf(t, srv, "hooks"); s["paused"] != true {
		t.Fatalf("after the pause from the list: %v", s)
	}
	shot(t, ctx, "subscriptions-paused")

	// Paused: a webhook waits in the inbox, undelivered.
	req, _ := http.NewRequest("POST", srv.Base+"/webhooks", strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "p-1")
	resp, err := srv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testenv.Eventually(t, 30*time.Second, "a pending item in hooks", func() bool {
		var page struct{ Items []json.RawMessage }
		call(t, srv, "", "GET", "/v1/inboxes/hooks/items?state=pending", nil, http.StatusOK, &page)
		return len(page.Items) == 1
	})

	do(t, ctx, "resume", chromedp.Click(chromedp.CSS(`#subscriptions-table tr[data-name=hooks] button.resume`)))
	wait(t, ctx, "hooks delivering", `document.querySelector('#subscriptions-table tr[data-name=hooks][data-paused=false] button.pause') !== null`)
	testenv.Eventually(t, 30*time.Second, "the webhook delivered after the resume", func() bool {
		tg.mu.Lock()
		defer tg.mu.Unlock()
		return len(tg.got) == 1
	})

	// From its page, with a reason.
	do(t, ctx, "the subscription", chromedp.Navigate(ui+"#/subscription/hooks"), chromedp.WaitVisible(chromedp.CSS(`#pause-btn`)))
	fill(t, ctx, ".page", map[string]string{"reason": "target migration"})
	do(t, ctx, "pause", chromedp.Click(chromedp.CSS(`#pause-btn`)))
	wait(t, ctx, "paused", `document.querySelector('#paused-state') !== null`)
	if s := subscriptionOf(t, srv, "hooks"); s["paused"] != true || s["paused_reason"] != "target migration" {
		t.Fatalf("after the pause from its page: %v", s)
	}
	if got := text(t, ctx, `#subscription-detail`); !strings.Contains(got, "target migration") {
		t.Errorf("the page does not say why it is paused: %q", got)
	}
	do(t, ctx, "resume", chromedp.Click(chromedp.CSS(`#resume-btn`)))
	wait(t, ctx, "resumed", `document.querySelector('#pause-btn') !== null`)
	if s := subscriptionOf(t, srv, "hooks"); s["paused"] != false {
		t.Fatalf("after the resume from its page: %v", s)
	}
}

// pullItems starts a server whose subscription jobs (no target) holds n
// pending items, and returns the server and their ids.
func pullItems(t *testing.T, n int) (*servertest.Server, []int64) {
	t.Helper()
	srv := servertest.Start(t, server.Config{}, nil)
	call(t, srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "jobs", "source": "webhooks", "start": "earliest"}, http.StatusCreated, nil)
	for i := 1; i <= n; i++ {
		req, _ := http.NewRequest("POST", srv.Base+"/webhooks", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("job-%d", i))
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var ids []int64
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d pending items in jobs", n), func() bool {
		var page struct{ Items []struct{ ID int64 } }
		call(t, srv, "", "GET", "/v1/inboxes/jobs/items?state=pending", nil, http.StatusOK, &page)
		ids = ids[:0]
		for _, it := range page.Items {
			ids = append(ids, it.ID)
		}
		return len(ids) == n
	})
	return srv, ids
}

// TestCancelItem cancels a pending item from its page: it becomes a dead
// letter with the operator's reason.
func TestCancelItem(t *testing.T) {
	srv, ids := pullItems(t, 1)
	ctx := tab(t, 1280, 900)
	do(t, ctx, "the item", chromedp.Navigate(fmt.Sprintf("%s/ui/#/item/jobs/%d", srv.Base, ids[0])), chromedp.WaitVisible(chromedp.CSS(`#cancel-item`)))
	confirm(t, ctx, "cancel", `#cancel-item`)
	wait(t, ctx, "cancelled", `document.querySelector('#item-note') !== null`)
	var it struct {
		State     string
		LastError string `json:"last_error"`
	}
	call(t, srv, "", "GET", fmt.Sprintf("/v1/inboxes/jobs/items/%d", ids[0]), nil, http.StatusOK, &it)
	if it.State != "failed" || it.LastError != "cancelled by an operator" {
		t.Fatalf("the cancelled item: %+v", it)
	}
	if got := text(t, ctx, `#item-fields`); !strings.Contains(got, "cancelled by an operator") {
		t.Errorf("the item's page after the cancel: %q", got)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#cancel-item').length`)); n != 0 {
		t.Error("a failed item still offers Cancel")
	}
}

// TestDiscardItem discards an item from its page, and sees the refusal
// of the API for one under lease.
func TestDiscardItem(t *testing.T) {
	srv, ids := pullItems(t, 2)
	ctx := tab(t, 1280, 900)
	ui := srv.Base + "/ui/"
	do(t, ctx, "the item", chromedp.Navigate(fmt.Sprintf("%s#/item/jobs/%d", ui, ids[0])), chromedp.WaitVisible(chromedp.CSS(`#discard-item`)))
	// Leased meanwhile: the API refuses, and the page says so.
	var l struct{ Items []struct{ ID int64 } }
	call(t, srv, "", "POST", "/v1/inboxes/jobs/lease", map[string]any{"max": 1}, http.StatusOK, &l)
	if len(l.Items) != 1 || l.Items[0].ID != ids[0] {
		t.Fatalf("lease: %+v, want item %d", l, ids[0])
	}
	confirm(t, ctx, "discard a leased item", `#discard-item`)
	wait(t, ctx, "the refusal", `document.querySelector('.page p.error') !== null`)
	if got := text(t, ctx, `.page p.error`); !strings.Contains(got, "409 invalid_state") {
		t.Errorf("the refusal shown: %q", got)
	}

	do(t, ctx, "the other item", chromedp.Navigate(fmt.Sprintf("%s#/item/jobs/%d", ui, ids[1])), chromedp.WaitVisible(chromedp.CSS(`#discard-item`)))
	confirm(t, ctx, "discard", `#discard-item`)
	wait(t, ctx, "the inbox", `document.querySelector('#inbox-note') !== null`)
	call(t, srv, "", "GET", fmt.Sprintf("/v1/inboxes/jobs/items/%d", ids[1]), nil, http.StatusNotFound, nil)
}

// TestDiscardDeadLetters discards a selection of dead letters, then every
// one a filter matches, from the dead-letter page.
func TestDiscardDeadLetters(t *testing.T) {
	s := seed(t, "", 5) // 4 dead letters in billing
	ctx := tab(t, 1280, 900)
	ui := s.srv.Base + "/ui/"
	do(t, ctx, "select two dead letters",
		chromedp.Navigate(ui+"#/dead-letters?inbox=billing"),
		chromedp.WaitVisible(chromedp.CSS(`#dead-letters-table`)),
		chromedp.Click(chromedp.CSS(`#dead-letters-table tbody tr:nth-child(1) input.pick`)),
		chromedp.Click(chromedp.CSS(`#dead-letters-table tbody tr:nth-child(3) input.pick`)))
	confirm(t, ctx, "discard the selection", `#discard-selected`)
	wait(t, ctx, "discarded", `document.querySelector('#discard-status') !== null`)
	if got := text(t, ctx, `#discard-status`); got != "Discarded 2 dead letters." {
		t.Errorf("after discarding two: %q", got)
	}
	var left struct{ Items []json.RawMessage }
	call(t, s.srv, "", "GET", "/v1/dead-letters?inbox=billing", nil, http.StatusOK, &left)
	if len(left.Items) != 2 {
		t.Fatalf("%d dead letters left, want 2", len(left.Items))
	}

	do(t, ctx, "the rest", chromedp.Navigate(ui+"#/dead-letters?subscription=billing"))
	wait(t, ctx, "2 dead letters", `document.querySelectorAll('#dead-letters-table tbody tr').length === 2 && !document.querySelector('#discard-status')`)
	confirm(t, ctx, "discard all", `#discard-all`)
	wait(t, ctx, "discarded", `document.querySelector('#discard-status') !== null`)
	if got := text(t, ctx, `#discard-status`); got != "Discarded 2 dead letters." {
		t.Errorf("after discarding all: %q", got)
	}
	call(t, s.srv, "", "GET", "/v1/dead-letters?inbox=billing", nil, http.StatusOK, &left)
	if len(left.Items) != 0 {
		t.Fatalf("%d dead letters left, want 0", len(left.Items))
	}
}

// TestSendTestEvent sends a test event from a subscription's page and
// shows what the endpoint answered, a failure too.
func TestSendTestEvent(t *testing.T) {
	tg := newTarget(t)
	srv := servertest.Start(t, server.Config{}, nil)
	call(t, srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "hooks", "source": "webhooks", "target": tg.URL,
		"headers": map[string]string{"X-Team": "ops"}}, http.StatusCreated, nil)
	ctx := tab(t, 1280, 900)
	do(t, ctx, "the subscription", chromedp.Navigate(srv.Base+"/ui/#/subscription/hooks"), chromedp.WaitVisible(chromedp.CSS(`#test-btn`)),
		chromedp.Click(chromedp.CSS(`#test-btn`)))
	wait(t, ctx, "the answer", `document.querySelector('#test-result') !== null`)
	got := text(t, ctx, `#test-result`)
	for _, want := range []string{"delivered", "200", `{"received":true}`, "test_"} {
		if !strings.Contains(got, want) {
			t.Errorf("the test result %q lacks %q", got, want)
		}
	}
	tg.mu.Lock()
	if len(tg.got) != 1 || tg.got[0].Header.Get("X-Event-Type") != "postbox.test" || tg.got[0].Header.Get("X-Team") != "ops" {
		t.Errorf("the endpoint got %d requests: %v", len(tg.got), tg.got)
	}
	tg.down = true
	tg.mu.Unlock()
	do(t, ctx, "send again", chromedp.Click(chromedp.CSS(`#test-btn`)))
	wait(t, ctx, "the failure", `document.querySelector('#test-result[data-ok=false]') !== null`)
	if got := text(t, ctx, `#test-result`); !strings.Contains(got, "503") || !strings.Contains(got, "down for maintenance") {
		t.Errorf("the failed test shows %q", got)
	}
	shot(t, ctx, "test-event")
}

// TestOverviewStuck: the overview lists the subscriptions that need an
// operator, a paused one and one with dead letters, with links to them,
// and says the writer and store are ready.
func TestOverviewStuck(t *testing.T) {
	s := seed(t, "", 2) // 2 dead letters in billing
	call(t, s.srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "idle", "source": "webhooks"}, http.StatusCreated, nil)
	call(t, s.srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "held", "source": "webhooks"}, http.StatusCreated, nil)
	call(t, s.srv, "", "POST", "/v1/subscriptions/held/pause", map[string]any{"reason": "audit"}, http.StatusOK, nil)
	ctx := tab(t, 1280, 900)
	do(t, ctx, "overview", chromedp.Navigate(s.srv.Base+"/ui/"))
	wait(t, ctx, "what is stuck", `document.querySelector('#stuck-table tr[data-name=held]') !== null`)
	if got := text(t, ctx, `#stuck-table tr[data-name=held]`); !strings.Contains(got, "paused") || !strings.Contains(got, "audit") {
		t.Errorf("the row of held: %q", got)
	}
	if got := text(t, ctx, `#stuck-table tr[data-name=billing] td.dead`); got != "2" {
		t.Errorf("billing's dead letters on the overview: %q, want 2", got)
	}
	if n, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#stuck-table tr[data-name=idle]').length`)); n != 0 {
		t.Error("the overview lists idle, which is not stuck")
	}
	if got := text(t, ctx, `#health`); !strings.Contains(got, "ready") || !strings.Contains(got, "writer queue") {
		t.Errorf("the health of the writer and store: %q", got)
	}
	shot(t, ctx, "overview-stuck")
	do(t, ctx, "follow the dead letters", chromedp.Click(chromedp.CSS(`#stuck-table tr[data-name=billing] td.dead a`)))
	wait(t, ctx, "billing's dead letters", `location.hash === '#/dead-letters?subscription=billing' && document.querySelectorAll('#dead-letters-table tbody tr').length === 2`)
	do(t, ctx, "overview", chromedp.Navigate(s.srv.Base+"/ui/"))
	wait(t, ctx, "what is stuck", `document.querySelector('#stuck-table tr[data-name=held] a') !== null`)
	do(t, ctx, "follow held", chromedp.Click(chromedp.CSS(`#stuck-table tr[data-name=held] td a`)))
	wait(t, ctx, "held's page", `document.querySelector('#resume-btn') !== null`)
}

// TestReplyRetry: an item's page shows its delivery handle and its
// replies; a failed reply (a dead letter) is sent again from there and
// reaches the handle's url.
func TestReplyRetry(t *testing.T) {
	tg := newTarget(t)
	tg.down = true
	srv := servertest.Start(t, server.Config{Delivery: delivery.Config{MaxAttempts: 1}}, nil)
	call(t, srv, "", "POST", "/v1/sources", map[string]any{"name": "talk", "kind": "webhook", "settings": map[string]any{"handle_header": "X-Reply-To"}},
		http.StatusCreated, nil)
	call(t, srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "talk-in", "source": "talk"}, http.StatusCreated, nil)
	req, _ := http.NewRequest("POST", srv.Base+"/webhooks/talk", strings.NewReader(`{"n":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "r-1")
	req.Header.Set("X-Reply-To", tg.URL+"/replies")
	resp, err := srv.HTTP.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook: %v %v", resp, err)
	}
	resp.Body.Close()
	var page struct{ Items []struct{ ID int64 } }
	testenv.Eventually(t, 10*time.Second, "the item", func() bool {
		call(t, srv, "", "GET", "/v1/inboxes/talk-in/items", nil, http.StatusOK, &page)
		return len(page.Items) == 1
	})
	path := fmt.Sprintf("/v1/inboxes/talk-in/items/%d", page.Items[0].ID)
	call(t, srv, "", "POST", path+"/reply", map[string]any{"key": "ack", "body": map[string]string{"text": "hi"}}, http.StatusAccepted, nil)
	var rs struct{ Replies []struct{ State string } }
	testenv.Eventually(t, 10*time.Second, "the reply to fail", func() bool {
		call(t, srv, "", "GET", path+"/replies", nil, http.StatusOK, &rs)
		return len(rs.Replies) == 1 && rs.Replies[0].State == "failed"
	})

	ctx := tab(t, 1280, 900)
	do(t, ctx, "the item", chromedp.Navigate(fmt.Sprintf("%s/ui/#/item/talk-in/%d", srv.Base, page.Items[0].ID)),
		chromedp.WaitVisible(chromedp.CSS(`#replies-table .retry-reply`)))
	if got := text(t, ctx, `#item-handle`); !strings.Contains(got, tg.URL+"/replies") {
		t.Errorf("the delivery handle on the page: %q", got)
	}
	if got := text(t, ctx, `#replies-table`); !strings.Contains(got, "ack") || !strings.Contains(got, "failed") || !strings.Contains(got, "503") {
		t.Errorf("the replies on the page: %q", got)
	}
	tg.mu.Lock()
	tg.down = false
	tg.mu.Unlock()
	do(t, ctx, "send again", chromedp.Click(chromedp.CSS(`#replies-table .retry-reply`)))
	wait(t, ctx, "the note", `document.querySelector('#item-note') !== null`)
	testenv.Eventually(t, 10*time.Second, "the reply to complete", func() bool {
		call(t, srv, "", "GET", path+"/replies", nil, http.StatusOK, &rs)
		return rs.Replies[0].State == "completed"
	})
}
