package console_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/postbox-events/postbox/internal/testenv"
)

// TestEventPage: an event's page, reached from the webhook lookup, the
// stream browser and an item, shows every subscription's delivery of it:
// the dead letter with the endpoint's 503, the default subscription's
// pending item, and the item of a subscription deleted since. The stream
// and inbox searches find events and items by type and id.
func TestEventPage(t *testing.T) {
	s := seed(t, "", 3) // evt-1 and evt-2 dead-lettered in billing; evt-3 a customer.created
	call(t, s.srv, "", "POST", "/v1/subscriptions", map[string]any{"name": "audit", "source": "webhooks", "start": "earliest"}, http.StatusCreated, nil)
	testenv.Eventually(t, 30*time.Second, "3 items in audit", func() bool {
		var page struct{ Items []json.RawMessage }
		call(t, s.srv, "", "GET", "/v1/inboxes/audit/items", nil, http.StatusOK, &page)
		return len(page.Items) == 3
	})
	call(t, s.srv, "", "DELETE", "/v1/subscriptions/audit", nil, http.StatusNoContent, nil)
	ctx := tab(t, 1280, 900)
	ui := s.srv.Base + "/ui/"

	// The webhook lookup shows the deliveries and links the event's page.
	do(t, ctx, "webhook lookup", chromedp.Navigate(ui+"#/webhooks?key=evt-1"), chromedp.WaitVisible(chromedp.CSS(`#deliveries-table`)))
	if got := text(t, ctx, `#webhook-result`); !strings.Contains(got, "failed") || !strings.Contains(got, "billing") {
		t.Errorf("webhook lookup: %q, want the dead letter of billing as its status", got)
	}
	checkDeliveries := func(where string) {
		t.Helper()
		for sel, want := range map[string][]string{
			`#deliveries-table tr[data-subscription=billing]`:  {"failed", "503", "billing is down"},
			`#deliveries-table tr[data-subscription=webhooks]`: {"pending"},
			`#deliveries-table tr[data-subscription=audit]`:    {"(deleted)", "pending"},
		} {
			got := text(t, ctx, sel)
			for _, w := range want {
				if !strings.Contains(got, w) {
					t.Errorf("%s: %s is %q, lacks %q", where, sel, got, w)
				}
			}
		}
	}
	checkDeliveries("webhook lookup")
	shot(t, ctx, "webhook-deliveries")

	do(t, ctx, "the event's page from the lookup", chromedp.Click(chromedp.CSS(`#webhook-event`)), chromedp.WaitVisible(chromedp.CSS(`#event-fields`)))
	wait(t, ctx, "the event page", `document.body.dataset.page === 'event'`)
	checkDeliveries("event page")
	if got := text(t, ctx, `#attempts-billing`); !strings.Contains(got, "503") || !strings.Contains(got, "billing is down") {
		t.Errorf("event page: billing's attempts %q lack the endpoint's 503 answer", got)
	}
	if got := text(t, ctx, `#event-fields`); !strings.Contains(got, "evt-1") || !strings.Contains(got, "invoice.paid") {
		t.Errorf("event page: fields %q", got)
	}
	shot(t, ctx, "event")

	// The stream browser: the newest events, a search by type, a link to
	// each event's page.
	do(t, ctx, "streams", chromedp.Navigate(ui+"#/streams"), chromedp.WaitVisible(chromedp.CSS(`#streams-table`)))
	do(t, ctx, "the stream browser", chromedp.Click(chromedp.CSS(`#streams-table tr[data-name=webhooks] a`)), chromedp.WaitVisible(chromedp.CSS(`#events-table`)))
	wait(t, ctx, "3 events", `document.querySelectorAll('#events-table tbody tr').length === 3`)
	do(t, ctx, "search by type",
		chromedp.SetValue(chromedp.CSS(`#event-search input[name=type]`), "customer.created"),
		chromedp.Click(chromedp.CSS(`#event-search button[type=submit]`)))
	wait(t, ctx, "1 customer.created event", `location.hash.includes('type=customer.created') && document.querySelectorAll('#events-table tbody tr').length === 1`)
	if got := text(t, ctx, `#events-table tbody tr`); !strings.Contains(got, "evt-3") {
		t.Errorf("stream search by type: %q, want evt-3", got)
	}
	shot(t, ctx, "stream")
	do(t, ctx, "an event from the stream browser", chromedp.Click(chromedp.CSS(`#events-table tbody tr td.num a`)), chromedp.WaitVisible(chromedp.CSS(`#event-fields`)))
	wait(t, ctx, "evt-3's page", `document.querySelector('#event-fields') && document.querySelector('#event-fields').textContent.includes('evt-3')`)
	if got := text(t, ctx, `#deliveries-table tr[data-subscription=webhooks]`); !strings.Contains(got, "pending") {
		t.Errorf("evt-3: the default subscription's delivery is %q", got)
	}
	wait(t, ctx, "no delivery of evt-3 to billing (it takes invoices)", `document.querySelector('#deliveries-table tr[data-subscription=billing]') === null`)

	// From an item: its event's page.
	do(t, ctx, "an inbox search", chromedp.Navigate(ui+"#/inbox?inbox=billing&state=failed"), chromedp.WaitVisible(chromedp.CSS(`#inbox-search-link`)))
	do(t, ctx, "the inbox search page", chromedp.Click(chromedp.CSS(`#inbox-search-link`)), chromedp.WaitVisible(chromedp.CSS(`#item-search`)))
	do(t, ctx, "search by id",
		chromedp.SetValue(chromedp.CSS(`#item-search input[name=id]`), "evt-2"),
		chromedp.Click(chromedp.CSS(`#item-search button[type=submit]`)))
	wait(t, ctx, "evt-2's item", `location.hash.includes('id=evt-2') && document.querySelectorAll('#search-items-table tbody tr').length === 1`)
	do(t, ctx, "the item", chromedp.Click(chromedp.CSS(`#search-items-table tbody tr td.num a`)), chromedp.WaitVisible(chromedp.CSS(`#item-event`)))
	do(t, ctx, "its event", chromedp.Click(chromedp.CSS(`#item-event`)), chromedp.WaitVisible(chromedp.CSS(`#event-fields`)))
	wait(t, ctx, "evt-2's page", `document.querySelector('#event-fields') && document.querySelector('#event-fields').textContent.includes('evt-2')`)
	checkDeliveries("evt-2's page")
}

// TestEventLoadTimes measures, as TestLoadTimes does, the pages of an
// event and the searches on a running server (POSTBOX_CONSOLE_SERVER,
// POSTBOX_CONSOLE_TOKEN), and the API calls behind them. It reports; it
// asserts nothing about time.
func TestEventLoadTimes(t *testing.T) {
	base := os.Getenv("POSTBOX_CONSOLE_SERVER")
	if base == "" {
		t.Skip("POSTBOX_CONSOLE_SERVER is not set: no server to measure")
	}
	token := os.Getenv("POSTBOX_CONSOLE_TOKEN")
	get := func(path string, out any) (float64, int) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			json.NewDecoder(resp.Body).Decode(out)
		} else {
			io.Copy(io.Discard, resp.Body)
		}
		return float64(time.Since(start).Microseconds()) / 1000, resp.StatusCode
	}
	var st struct {
		LastOffset int64 `json:"last_offset"`
	}
	get("/v1/streams/devices", &st)
	mid := st.LastOffset / 2
	var ev struct {
		EventID  string    `json:"event_id"`
		Variant  string    `json:"variant"`
		Type     string    `json:"type"`
		StoredAt time.Time `json:"stored_at"`
	}
	get(fmt.Sprintf("/v1/streams/devices/events/%d", mid), &ev)
	// A minute around the middle event: a range holding events and
	// items, beside one before any.
	around := "since=" + ev.StoredAt.Add(-30*time.Second).Format(time.RFC3339) + "&until=" + ev.StoredAt.Add(30*time.Second).Format(time.RFC3339)
	pages := []string{
		fmt.Sprintf("#/event/devices/%d", mid), "#/event/webhooks/1", "#/webhooks?key=evt-1",
		"#/stream/devices", "#/stream/devices?type=nothing.such", "#/stream/webhooks?type=invoice.paid",
		"#/stream/devices?id=" + ev.EventID, "#/stream/devices?since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00Z",
		"#/inbox-search?inbox=planner", "#/inbox-search?inbox=planner&id=" + ev.EventID,
		"#/inbox-search?inbox=planner&type=nothing.such", "#/inbox-search?inbox=billing&state=failed",
		"#/stream/devices?type=" + ev.Type, "#/stream/devices?" + around, "#/inbox-search?inbox=planner&type=" + ev.Type + "&" + around,
		"#/inbox-search?inbox=planner&state=completed", "#/inbox-search?inbox=planner&state=pending&type=nothing.such",
	}
	ctx := tab(t, 1280, 1000)
	if token != "" {
		do(t, ctx, "keep the token", chromedp.Navigate(base+"/ui/"),
			chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`sessionStorage.setItem('postbox.token', %q)`, token)))
	}
	const apiMS = `(() => {
		const r = performance.getEntriesByType('resource').filter((e) => /\/(v1|webhooks|health)/.test(new URL(e.name).pathname));
		return r.length ? Math.max(...r.map((e) => e.responseEnd)) - Math.min(...r.map((e) => e.startTime)) : 0;
	})()`
	for _, page := range pages {
		var ms, api []float64
		for range 5 {
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
		}
		slices.Sort(ms)
		slices.Sort(api)
		t.Logf("page /ui/%-60s load and draw: median %6.1f ms, slowest %6.1f ms; waiting for the API: median %5.1f ms",
			page, ms[len(ms)/2], ms[len(ms)-1], api[len(api)/2])
	}
	for _, path := range []string{
		fmt.Sprintf("/v1/streams/devices/events/%d", mid), "/v1/streams/devices/events?id=" + ev.EventID + "&variant=" + ev.Variant,
		"/webhooks?idempotency_key=evt-1", "/v1/streams/devices/search?limit=50",
		"/v1/streams/devices/search?type=nothing.such&limit=50", "/v1/streams/devices/search?id=" + ev.EventID,
		"/v1/streams/devices/search?since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00Z&limit=50",
		"/v1/inboxes/planner/search?limit=50", "/v1/inboxes/planner/search?id=" + ev.EventID,
		"/v1/inboxes/planner/search?type=nothing.such&limit=50", "/v1/inboxes/planner/search?since=2026-01-01T00:00:00Z&until=2026-01-02T00:00:00Z&limit=50",
		"/v1/inboxes/billing/search?state=failed&limit=50",
		"/v1/streams/devices/search?limit=50&type=" + ev.Type, "/v1/streams/devices/search?limit=50&" + around,
		"/v1/streams/devices/search?limit=50&type=" + ev.Type + "&" + around,
		"/v1/inboxes/planner/search?limit=50&type=" + ev.Type, "/v1/inboxes/planner/search?limit=50&" + around,
		"/v1/inboxes/planner/search?limit=50&type=" + ev.Type + "&" + around,
		"/v1/inboxes/planner/search?limit=50&state=pending", "/v1/inboxes/planner/search?limit=50&state=completed",
		"/v1/inboxes/planner/search?limit=50&state=pending&type=nothing.such",
	} {
		var ms []float64
		for range 5 {
			d, status := get(path, nil)
			if status != http.StatusOK {
				t.Errorf("GET %s: %d", path, status)
			}
			ms = append(ms, d)
		}
		slices.Sort(ms)
		t.Logf("GET %-90s median %6.1f ms, slowest %6.1f ms", path, ms[len(ms)/2], ms[len(ms)-1])
	}
}
