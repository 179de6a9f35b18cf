package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// The console's tests drive a real headless Chromium (Debian's chromium
// package, or POSTBOX_CHROMIUM) with chromedp against a real server. One
// browser serves the whole package; each test opens its own tab.
//
// POSTBOX_SCREENSHOTS=DIR writes a screenshot of each page into DIR
// (docs/console holds the ones the README shows).

var (
	browserOnce sync.Once
	browserCtx  context.Context
	browserErr  error
	stopBrowser = func() {}
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopBrowser()
	os.Exit(code)
}

// findChromium returns the path of a Chromium or Chrome, or "".
func findChromium() string {
	if p := os.Getenv("POSTBOX_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// tab opens a new tab of the package's browser (started at the first
// call), closed when the test ends. Without a browser the test is skipped
// loudly, or fails under POSTBOX_REQUIRE_SERVICES=1.
func tab(t *testing.T, width, height int64) context.Context {
	t.Helper()
	path := findChromium()
	if path == "" {
		testenv.Skip(t, "!!! no Chromium found (apt-get install chromium, or set POSTBOX_CHROMIUM): the console's browser tests did not run")
	}
	browserOnce.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.NoSandbox, // root in CI containers
			chromedp.Flag("disable-gpu", true),
			chromedp.Flag("disable-quic", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			// Names of other sites, pointed at loopback (crossorigin_test.go).
			chromedp.Flag("host-resolver-rules", "MAP evil.test 127.0.0.1, MAP rebound.test 127.0.0.1"),
			chromedp.WindowSize(1280, 900),
		)
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancelCtx := chromedp.NewContext(alloc)
		stopBrowser = func() { cancelCtx(); cancelAlloc() }
		browserErr = chromedp.Do(ctx) // starts the browser
		browserCtx = ctx
	})
	if browserErr != nil {
		t.Fatalf("start %s: %v", path, browserErr)
	}
	ctx, cancel := chromedp.NewContext(browserCtx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// do runs steps within a generous bound (the machine may be busy).
func do(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// text is the text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// wait waits until the JavaScript expression is truthy.
func wait(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	do(t, ctx, "wait for "+what, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
}

// shot saves a screenshot of the screen (the tab's viewport) as NAME.png
// under POSTBOX_SCREENSHOTS, when it is set.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("POSTBOX_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// call sends a request to the API of s and decodes the JSON answer into
// out (when not nil), failing the test on another status than want.
func call(t *testing.T, s *servertest.Server, token, method, path string, body any, want int, out any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.Base+path, r)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// seeded is a server holding webhooks in the default inbox and dead
// letters in the inbox billing, whose target fails until ok is set.
type seeded struct {
	srv   *servertest.Server
	token string
	ok    *atomic.Bool
}

func seed(t *testing.T, token string, webhooks int) seeded {
	t.Helper()
	ok := new(atomic.Bool)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ok.Load() {
			http.Error(w, "billing is down for maintenance", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(target.Close)
	srv := servertest.Start(t, server.Config{APIToken: token, StatsInterval: 250 * time.Millisecond}, nil)
	call(t, srv, token, "POST", "/v1/subscriptions", map[string]any{
		"name": "billing", "source": "webhooks", "start": "earliest", "types": []string{"invoice.*"},
		"target": target.URL, "max_attempts": 1, "breaker_failures": 0,
	}, http.StatusCreated, nil)
	for i := 1; i <= webhooks; i++ {
		typ := "invoice.paid"
		if i%3 == 0 {
			typ = "customer.created"
		}
		req, _ := http.NewRequest("POST", srv.Base+"/webhooks", strings.NewReader(fmt.Sprintf(`{"invoice":"in_%d","amount":%d}`, i, i*100)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("evt-%d", i))
		req.Header.Set("X-Event-Type", typ)
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %d", resp.StatusCode)
		}
	}
	want := 0
	for i := 1; i <= webhooks; i++ {
		if i%3 != 0 {
			want++
		}
	}
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("%d dead letters in billing", want), func() bool {
		var page struct{ Items []json.RawMessage }
		call(t, srv, token, "GET", "/v1/dead-letters?inbox=billing", nil, http.StatusOK, &page)
		return len(page.Items) == want
	})
	return seeded{srv: srv, token: token, ok: ok}
}

// TestPages opens each page of the console on a seeded server and finds
// the server's data on it, then replays a dead letter from the page and
// sees it delivered.
func TestPages(t *testing.T) {
	s := seed(t, "", 5) // 5 webhooks: 4 invoices dead-lettered in billing, 5 pending in webhooks
	ctx := tab(t, 1280, 900)
	ui := s.srv.Base + "/ui/"

	do(t, ctx, "overview", chromedp.Navigate(ui))
	wait(t, ctx, "the overview's charts", `document.querySelectorAll('#charts svg polyline').length >= 4`)
	if got := text(t, ctx, `[data-tile=stored] b`); got != "5" {
		t.Errorf("overview: events stored %q, want 5", got)
	}
	if got := text(t, ctx, `[data-tile=dead] b`); got != "4" {
		t.Errorf("overview: dead-lettered %q, want 4", got)
	}
	shot(t, ctx, "overview")

	do(t, ctx, "streams", chromedp.Navigate(ui+"#/streams"), chromedp.WaitVisible(chromedp.CSS(`#streams-table`)))
	row := text(t, ctx, `#streams-table tr[data-name=webhooks]`)
	for _, want := range []string{"webhooks", "sqlite", "5"} {
		if !strings.Contains(row, want) {
			t.Errorf("streams: the row of webhooks %q lacks %q", row, want)
		}
	}
	if row := text(t, ctx, `#sources-table tr[data-name=devices]`); !strings.Contains(row, "device") {
		t.Errorf("sources: the row of devices is %q", row)
	}
	shot(t, ctx, "streams")

	do(t, ctx, "subscriptions", chromedp.Navigate(ui+"#/subscriptions"), chromedp.WaitVisible(chromedp.CSS(`#subscriptions-table tr[data-name=billing]`)))
	row = text(t, ctx, `#subscriptions-table tr[data-name=billing]`)
	for _, want := range []string{"billing", "invoice.*", "http://127.0.0.1", "closed"} {
		if !strings.Contains(row, want) {
			t.Errorf("subscriptions: the row of billing %q lacks %q", row, want)
		}
	}
	wait(t, ctx, "the lag chart", `document.querySelectorAll('svg polyline').length >= 1`)
	shot(t, ctx, "subscriptions")

	do(t, ctx, "inbox", chromedp.Navigate(ui+"#/inbox?inbox=webhooks&state=pending"), chromedp.WaitVisible(chromedp.CSS(`#items-table`)))
	wait(t, ctx, "5 pending items", `document.querySelectorAll('#items-table tbody tr').length === 5`)
	if got := text(t, ctx, `#items-shown`); got != "5 pending items." {
		t.Errorf("inbox: %q, want 5 pending items.", got)
	}
	if got := text(t, ctx, `#inbox-states a.active`); got != "pending 5" {
		t.Errorf("inbox: the state shown is %q, want pending and its count, 5", got)
	}
	shot(t, ctx, "inbox")

	// One dead letter: its payload, attempts and last error.
	do(t, ctx, "dead letters", chromedp.Navigate(ui+"#/dead-letters?inbox=billing"), chromedp.WaitVisible(chromedp.CSS(`#dead-letters-table`)))
	wait(t, ctx, "4 dead letters", `document.querySelectorAll('#dead-letters-table tbody tr').length === 4`)
	if got := text(t, ctx, `#dead-letters-table tbody tr`); !strings.Contains(got, "503") {
		t.Errorf("dead letters: the first row %q does not show its last error", got)
	}
	shot(t, ctx, "dead-letters")
	first := text(t, ctx, `#dead-letters-table tbody tr td.num a`)
	do(t, ctx, "open a dead letter", chromedp.Click(chromedp.CSS(`#dead-letters-table tbody tr td.num a`)), chromedp.WaitVisible(chromedp.CSS(`#item-payload`)))
	if got := text(t, ctx, `#item-payload`); !strings.Contains(got, `"invoice": "in_1"`) {
		t.Errorf("item %s: payload %q", first, got)
	}
	if got := text(t, ctx, `#attempts-table`); !strings.Contains(got, "503") || !strings.Contains(got, "billing is down") {
		t.Errorf("item %s: attempts %q lack the 503", first, got)
	}
	if got := text(t, ctx, `#item-fields`); !strings.Contains(got, "billing is down") {
		t.Errorf("item %s: fields %q lack the last error", first, got)
	}
	if stray, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`[...document.querySelector('.page').childNodes].some((n) => n.nodeType === Node.TEXT_NODE)`)); stray {
		t.Errorf("item %s: the page holds a stray text node (a null drawn as text?)", first)
	}
	shot(t, ctx, "item")

	// Replay the selection of two from the dead-letter page: confirmed,
	// then followed until delivered.
	s.ok.Store(true)
	do(t, ctx, "select two dead letters",
		chromedp.Navigate(ui+"#/dead-letters?inbox=billing"),
		chromedp.WaitVisible(chromedp.CSS(`#dead-letters-table`)),
		chromedp.Click(chromedp.CSS(`#dead-letters-table tbody tr:nth-child(1) input.pick`)),
		chromedp.Click(chromedp.CSS(`#dead-letters-table tbody tr:nth-child(2) input.pick`)),
		chromedp.Click(chromedp.CSS(`#replay-selected`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm-dialog[open]`)),
		chromedp.Click(chromedp.CSS(`#confirm-ok`)),
	)
	wait(t, ctx, "the replayed dead letters delivered", `document.querySelector('#replay-status[data-done=true]') !== null`)
	if got := text(t, ctx, `#replay-status`); !strings.Contains(got, "Delivered 2 of 2") {
		t.Errorf("replay progress says %q, want Delivered 2 of 2", got)
	}
	var item struct{ State string }
	call(t, s.srv, "", "GET", "/v1/inboxes/billing/items/"+first, nil, http.StatusOK, &item)
	if item.State != "completed" {
		t.Errorf("item %s after its replay from the console: %s, want completed", first, item.State)
	}
	var left struct{ Items []json.RawMessage }
	call(t, s.srv, "", "GET", "/v1/dead-letters?inbox=billing", nil, http.StatusOK, &left)
	if len(left.Items) != 2 {
		t.Errorf("%d dead letters left, want 2", len(left.Items))
	}

	// Replay all that remain, confirmed (another filter: a new page).
	do(t, ctx, "list the rest", chromedp.Navigate(ui+"#/dead-letters?subscription=billing"))
	wait(t, ctx, "the 2 dead letters left", `document.querySelectorAll('#dead-letters-table tbody tr').length === 2 && !document.querySelector('#replay-status')`)
	do(t, ctx, "replay all",
		chromedp.Click(chromedp.CSS(`#replay-all`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm-dialog[open]`)),
		chromedp.Click(chromedp.CSS(`#confirm-ok`)),
	)
	wait(t, ctx, "every dead letter delivered", `document.querySelector('#replay-status[data-done=true]') !== null`)
	if got := text(t, ctx, `#replay-status`); !strings.Contains(got, "Replayed 2. Delivered 2 of 2") {
		t.Errorf("replay-all progress says %q", got)
	}
	call(t, s.srv, "", "GET", "/v1/dead-letters?inbox=billing", nil, http.StatusOK, &left)
	if len(left.Items) != 0 {
		t.Errorf("%d dead letters left after replaying all, want 0", len(left.Items))
	}

	// Deliver billing's four items again: a replay job of a time range,
	// started from the subscriptions page and followed to its end.
	do(t, ctx, "replay a range",
		chromedp.Navigate(ui+"#/subscriptions"),
		chromedp.WaitVisible(chromedp.CSS(`#range-form`)),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#range-form [name=subscription]').value = 'billing';
			document.querySelector('#range-form [name=since]').value = '2000-01-01T00:00';
			document.querySelector('#range-form [name=states]').value = 'completed'`),
		chromedp.Click(chromedp.CSS(`#range-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm-dialog[open]`)),
		chromedp.Click(chromedp.CSS(`#confirm-ok`)),
	)
	wait(t, ctx, "the replay job to end", `document.querySelector('#range-status[data-state=completed]') !== null`)
	if got := text(t, ctx, `#range-status`); !strings.Contains(got, "4 of 4 items") {
		t.Errorf("range replay: %q, want 4 of 4 items", got)
	}
	shot(t, ctx, "subscriptions-replay")
	var jobs struct{ Replays []struct{ Replayed int } }
	call(t, s.srv, "", "GET", "/v1/replays?subscription=billing", nil, http.StatusOK, &jobs)
	if len(jobs.Replays) != 1 || jobs.Replays[0].Replayed != 4 {
		t.Errorf("replay jobs of billing: %+v, want one that replayed 4", jobs.Replays)
	}

	do(t, ctx, "webhooks", chromedp.Navigate(ui+"#/webhooks?key=evt-2"), chromedp.WaitVisible(chromedp.CSS(`#webhook-result`)))
	if got := text(t, ctx, `#webhook-result`); !strings.Contains(got, "wh_2") || !strings.Contains(got, "invoice.paid") {
		t.Errorf("webhook lookup by key: %q", got)
	}
	do(t, ctx, "webhook by id", chromedp.Navigate(ui+"#/webhooks?id=wh_3"), chromedp.WaitVisible(chromedp.CSS(`#webhook-result`)))
	if got := text(t, ctx, `#webhook-result`); !strings.Contains(got, "evt-3") {
		t.Errorf("webhook lookup by id: %q", got)
	}
	shot(t, ctx, "webhooks")
	do(t, ctx, "unknown webhook", chromedp.Navigate(ui+"#/webhooks?id=wh_999"), chromedp.WaitVisible(chromedp.CSS(`#webhook-result.error`)))

	// A webhook of a source of its own: found by key in that source, and
	// not in the default one.
	call(t, s.srv, "", "POST", "/v1/sources", map[string]any{"name": "gh", "kind": "webhook"}, http.StatusCreated, nil)
	req, _ := http.NewRequest("POST", s.srv.Base+"/webhooks/gh", strings.NewReader(`{"action":"opened"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "delivery-1")
	req.Header.Set("X-Event-Type", "pull_request")
	resp, err := s.srv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /webhooks/gh: %s", resp.Status)
	}
	do(t, ctx, "webhook of a source by key", chromedp.Navigate(ui+"#/webhooks?key=delivery-1&source=gh"), chromedp.WaitVisible(chromedp.CSS(`#webhook-result`)))
	if got := text(t, ctx, `#webhook-result`); !strings.Contains(got, "wh_gh_1") || !strings.Contains(got, "pull_request") {
		t.Errorf("webhook lookup by key in source gh: %q", got)
	}
	do(t, ctx, "the key in the default source", chromedp.Navigate(ui+"#/webhooks?key=delivery-1"), chromedp.WaitVisible(chromedp.CSS(`#webhook-result.error`)))
}

// TestPhoneWidth checks that the pages fit a phone's width: nothing but
// the tables' own scrolling boxes is wider than the screen.
func TestPhoneWidth(t *testing.T) {
	s := seed(t, "", 3)
	ctx := tab(t, 390, 844)
	ui := s.srv.Base + "/ui/"
	for _, page := range []string{"", "#/streams", "#/subscriptions", "#/inbox", "#/dead-letters", "#/webhooks"} {
		do(t, ctx, "open "+page, chromedp.Navigate(ui+page))
		wait(t, ctx, page+" rendered", `document.body.dataset.page !== undefined && !document.querySelector('.page > p.muted:only-child')`)
		if page == "" {
			wait(t, ctx, "the overview's charts", `document.querySelectorAll('#charts svg polyline').length >= 4`)
		}
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth`))
		if err != nil {
			t.Fatal(err)
		}
		if width > 390 {
			t.Errorf("%s at phone width: the page is %dpx wide, more than the 390px screen", page, width)
		}
		if page == "" {
			shot(t, ctx, "phone-overview")
		}
		if page == "#/dead-letters" {
			shot(t, ctx, "phone-dead-letters")
		}
	}
}

// TestToken checks that a server with an API token serves the console's
// files without it, that the pages ask for it when the API answers 401,
// keep it in sessionStorage, never put it in a URL, and ask again when it
// is wrong.
func TestToken(t *testing.T) {
	const token = "console-test-token-7f3a"
	s := seed(t, token, 2)

	resp, err := http.Get(s.srv.Base + "/ui/app.js")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/app.js without the token: %d, want 200", resp.StatusCode)
	}
	resp, err = http.Get(s.srv.Base + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/stats without the token: %d, want 401", resp.StatusCode)
	}

	ctx := tab(t, 1280, 900)
	ui := s.srv.Base + "/ui/"
	do(t, ctx, "open the streams page", chromedp.Navigate(ui+"#/streams"), chromedp.WaitVisible(chromedp.CSS(`#token-dialog[open]`)))
	shot(t, ctx, "token")
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#streams-table').length`)); err != nil || n != 0 {
		t.Fatalf("the streams page shows a table without the token (%d, %v)", n, err)
	}
	do(t, ctx, "give a wrong token",
		chromedp.SendKeys(chromedp.CSS(`#token-input`), "wrong"),
		chromedp.Click(chromedp.CSS(`#token-submit`)),
	)
	wait(t, ctx, "the dialog to ask again", `document.querySelector('#token-dialog[open]') && !document.querySelector('#token-error').hidden`)
	do(t, ctx, "give the token",
		chromedp.SendKeys(chromedp.CSS(`#token-input`), token),
		chromedp.Click(chromedp.CSS(`#token-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`#streams-table tr[data-name=webhooks]`)),
	)
	// Other pages use the kept token without asking.
	do(t, ctx, "open the dead letters", chromedp.Navigate(ui+"#/dead-letters"), chromedp.WaitVisible(chromedp.CSS(`#dead-letters-table`)))
	if open, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('#token-dialog').open`)); open {
		t.Error("the dead-letter page asked for the token again")
	}
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem('postbox.token')`))
	if err != nil || kept != token {
		t.Errorf("sessionStorage holds %q (%v), want the token", kept, err)
	}
	local, _ := chromedp.Run(ctx, chromedp.Evaluate[int](`localStorage.length`))
	if local != 0 {
		t.Errorf("localStorage holds %d keys: the token must not outlive the session", local)
	}
	urls, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[location.href, ...performance.getEntriesByType('resource').map((e) => e.name)]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(urls) < 3 {
		t.Fatalf("the browser made only these requests: %q", urls)
	}
	for _, u := range urls {
		if strings.Contains(u, token) {
			t.Errorf("the token is in a URL: %s", u)
		}
	}
}

// TestLoadTimes measures how long each page of a running server takes to
// load and draw in the browser (median and slowest of 5 full loads), and
// how long each API call behind it takes: set POSTBOX_CONSOLE_SERVER to
// its address (and POSTBOX_CONSOLE_TOKEN to its API token, if any).
// BENCHMARKS.md records it on a server holding 1,000,000 events. It
// reports; it asserts nothing about time.
func TestLoadTimes(t *testing.T) {
	base := os.Getenv("POSTBOX_CONSOLE_SERVER")
	if base == "" {
		t.Skip("POSTBOX_CONSOLE_SERVER is not set: no server to measure")
	}
	token := os.Getenv("POSTBOX_CONSOLE_TOKEN")
	pages := []string{"", "#/streams", "#/subscriptions", "#/inbox?inbox=planner", "#/inbox?inbox=planner&state=completed",
		"#/inbox?inbox=billing&state=failed", "#/item/planner/1", "#/dead-letters", "#/dead-letters?inbox=billing", "#/webhooks?key=evt-1",
		"#/subscription/planner", "#/new-subscription"}
	ctx := tab(t, 1280, 1000)
	if token != "" {
		do(t, ctx, "keep the token", chromedp.Navigate(base+"/ui/"),
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`sessionStorage.setItem('postbox.token', %q)`, token)))
	}
	// With POSTBOX_SCREENSHOTS, the first load of these is saved.
	shots := map[string]string{"": "overview", "#/streams": "streams", "#/subscriptions": "subscriptions",
		"#/inbox?inbox=planner": "inbox", "#/dead-letters": "dead-letters", "#/webhooks?key=evt-1": "webhooks"}
	var dead struct{ Items []struct{ ID int64 } }
	req, _ := http.NewRequest("GET", base+"/v1/dead-letters?inbox=billing&limit=1", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		json.NewDecoder(resp.Body).Decode(&dead)
		resp.Body.Close()
	}
	if len(dead.Items) == 1 {
		page := fmt.Sprintf("#/item/billing/%d", dead.Items[0].ID)
		pages, shots[page] = append(pages, page), "item"
	}
	// apiMS is how long the page waited for the API: from its first call's
	// start to its last call's end (Resource Timing).
	const apiMS = `(() => {
		const r = performance.getEntriesByType('resource').filter((e) => /\/(v1|webhooks|health)/.test(new URL(e.name).pathname));
		return r.length ? Math.max(...r.map((e) => e.responseEnd)) - Math.min(...r.map((e) => e.startTime)) : 0;
	})()`
	for _, page := range pages {
		var ms, api []float64
		for i := range 5 {
			do(t, ctx, "blank", chromedp.Navigate("about:blank"))
			do(t, ctx, "open "+page, chromedp.Navigate(base+"/ui/"+page))
			var drawn float64
			testenv.Eventually(t, 60*time.Second, page+" drawn", func() bool {
				v, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`window.postboxDrawnAt || 0`))
				drawn = v
				return err == nil && v > 0
			})
			ms = append(ms, drawn)
			a, err := chromedp.Run(ctx, chromedp.Evaluate[float64](apiMS))
			if err != nil {
				t.Fatal(err)
			}
			api = append(api, a)
			if name, ok := shots[page]; ok && i == 0 {
				shot(t, ctx, name)
			}
		}
		slices.Sort(ms)
		slices.Sort(api)
		t.Logf("page /ui/%-38s load and draw: median %6.1f ms, slowest %6.1f ms; waiting for the API: median %5.1f ms",
			page, ms[len(ms)/2], ms[len(ms)-1], api[len(api)/2])
	}
	if os.Getenv("POSTBOX_SCREENSHOTS") != "" {
		phone := tab(t, 390, 844)
		if token != "" {
			do(t, phone, "keep the token", chromedp.Navigate(base+"/ui/"),
				chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`sessionStorage.setItem('postbox.token', %q)`, token)))
		}
		for page, name := range map[string]string{"": "phone-overview", "#/dead-letters": "phone-dead-letters"} {
			do(t, phone, "open "+page, chromedp.Navigate("about:blank"), chromedp.Navigate(base+"/ui/"+page))
			wait(t, phone, page+" drawn", `document.body.dataset.page !== undefined`)
			shot(t, phone, name)
		}
	}
	for _, path := range []string{"/v1/stats", "/v1/sources", "/v1/streams", "/v1/subscriptions",
		"/v1/inboxes", "/v1/inboxes/planner/items?limit=50", // the second is not called by the console: it scans the inbox
		"/v1/inboxes/planner/items?state=pending&limit=50", "/v1/inboxes/planner/items?state=completed&limit=50",
		"/v1/inboxes/billing/items?state=failed&limit=50", "/v1/inboxes/planner/items/1",
		"/v1/inboxes/planner/items/1/attempts", "/v1/dead-letters?limit=50", "/v1/dead-letters?inbox=billing&limit=50",
		"/webhooks?idempotency_key=evt-1"} {
		var ms []float64
		for range 5 {
			req, _ := http.NewRequest("GET", base+path, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ms = append(ms, float64(time.Since(start).Microseconds())/1000)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s: %d", path, resp.StatusCode)
			}
		}
		slices.Sort(ms)
		t.Logf("GET %-52s median %6.1f ms, slowest %6.1f ms", path, ms[len(ms)/2], ms[len(ms)-1])
	}
}
