package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
)

// call does one API request, a body as application/json, and returns the
// status and the decoded body.
func call(t *testing.T, ts *testServer, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, ts.Base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if resp.StatusCode != http.StatusNoContent {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%s %s: Content-Type %q, body %s", method, path, ct, data)
		}
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: body is not a JSON object: %s", method, path, data)
		}
	}
	return resp.StatusCode, out
}

// TestNoRoute: a path no route takes is a JSON 404, and a method the
// path does not take a JSON 405 whose Allow names those it does.
func TestNoRoute(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if st, body := call(t, ts, "GET", "/v1/nosuch", ""); st != 404 || body["error"].(map[string]any)["code"] != "not_found" {
		t.Errorf("GET /v1/nosuch: %d %v, want 404 not_found", st, body)
	}
	req, _ := http.NewRequest("PUT", ts.Base+"/webhooks", strings.NewReader("{}"))
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD, POST" || !strings.Contains(string(data), `"code":"method_not_allowed"`) {
		t.Errorf("PUT /webhooks: %s, Allow %q, %s; want 405 method_not_allowed, Allow GET, HEAD, POST", resp.Status, resp.Header.Get("Allow"), data)
	}
	// A path that is not clean is a JSON 404, not ServeMux's redirect to
	// its clean form.
	for _, p := range []string{"/v1/subscriptions/../../etc/passwd", "//v1/subscriptions", "/v1/./subscriptions", "/."} {
		req, _ := http.NewRequest("GET", ts.Base+p, nil)
		resp, err := http.DefaultTransport.RoundTrip(req) // no redirects followed
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(string(data), `"code":"not_found"`) {
			t.Errorf("GET %s: %s %s, want a JSON 404", p, resp.Status, data)
		}
	}
	// The bulk replay's path is not a dead letter's id.
	resp, err = ts.HTTP.Get(ts.Base + "/v1/dead-letters/replay")
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || !strings.Contains(string(data), `"code":"method_not_allowed"`) {
		t.Errorf("GET /v1/dead-letters/replay: %s, Allow %q, %s; want 405 method_not_allowed, Allow POST", resp.Status, resp.Header.Get("Allow"), data)
	}
}

// TestAPIBadInput: every mistake gets its status and a JSON error whose
// code is the documented one and whose message names what is wrong.
func TestAPIBadInput(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	huge := `{"name":"x","source":"devices","inbox":"` + strings.Repeat("a", 2<<20) + `"}`
	for _, c := range []struct {
		method, path, body string
		status             int
		code, mentions     string
	}{
		{"POST", "/v1/subscriptions", ``, 400, "invalid_json", "empty"},
		{"POST", "/v1/subscriptions", `{"name":`, 400, "invalid_json", "invalid"},
		{"POST", "/v1/subscriptions", `[]`, 400, "invalid_json", "array"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","colour":"red"}`, 400, "unknown_field", "colour"},
		{"POST", "/v1/subscriptions", `{"source":"devices"}`, 400, "missing_field", "name"},
		{"POST", "/v1/subscriptions", `{"name":"a"}`, 400, "missing_field", "source"},
		{"POST", "/v1/subscriptions", `{"name":"a b","source":"devices"}`, 400, "invalid_field", "name"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","types":"x.*"}`, 400, "invalid_json", "types"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start":"soon"}`, 400, "invalid_field", "start"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start":"at_offset"}`, 400, "invalid_field", "start_offset"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start":"at_offset","start_offset":7}`, 400, "invalid_field", "start_offset"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start_offset":7}`, 400, "invalid_field", "start_offset"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start":"at_time","start_time":"yesterday"}`, 400, "invalid_field", "start_time"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"nowhere"}`, 404, "not_found", "nowhere"},
		{"POST", "/v1/subscriptions", huge, 413, "too_large", "bytes"},
		{"GET", "/v1/subscriptions/nope", ``, 404, "not_found", "nope"},
		{"DELETE", "/v1/subscriptions/nope", ``, 404, "not_found", "nope"},
		{"GET", "/v1/streams/nope", ``, 404, "not_found", "nope"},
		{"GET", "/v1/inboxes/x/items?state=done", ``, 400, "invalid_field", "state"},
		{"GET", "/v1/inboxes/x/items?limit=0", ``, 400, "invalid_field", "limit"},
		{"GET", "/v1/inboxes/x/items?after=-1", ``, 400, "invalid_field", "after"},
		{"GET", "/v1/inboxes/x/items/abc", ``, 400, "invalid_field", "abc"},
		{"GET", "/v1/inboxes/x/items/99", ``, 404, "not_found", "99"},
		{"POST", "/v1/inboxes/x/lease", `{"max":0}`, 400, "invalid_field", "max"},
		{"POST", "/v1/inboxes/x/lease", `{"max":"ten"}`, 400, "invalid_json", "max"},
		{"POST", "/v1/inboxes/x/lease", `{"visibility_timeout":"soon"}`, 400, "invalid_field", "soon"},
		{"POST", "/v1/inboxes/x/lease", `{"visibility_timeout":"0s"}`, 400, "invalid_field", "visibility_timeout"},
		{"POST", "/v1/inboxes/x/lease", `{"wait":"2m"}`, 400, "invalid_field", "wait"},
		{"POST", "/v1/inboxes/x/ack", `{}`, 400, "missing_field", "ids"},
		{"POST", "/v1/inboxes/x/ack", `{"ids":[0]}`, 400, "invalid_field", "ids"},
		{"POST", "/v1/inboxes/x/ack", `{"ids":[1],"delay":"1s"}`, 400, "unknown_field", "nack"},
		{"POST", "/v1/inboxes/x/nack", `{"ids":[1],"delay":"-1s"}`, 400, "invalid_field", "duration"},
		// Names are case-sensitive, and a name given twice is refused, where
		// encoding/json alone would take "NAME" for "name" and keep the last.
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","NAME":"x"}`, 400, "unknown_field", `"NAME" (names are case-sensitive: "name")`},
		{"POST", "/v1/subscriptions", `{"Name":"a","source":"devices"}`, 400, "unknown_field", `"Name"`},
		{"POST", "/v1/subscriptions", `{"name":"a","name":"b","source":"devices"}`, 400, "invalid_json", `"name" appears twice`},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","metadata":{"k":"1","k":"2"}}`, 400, "invalid_json", `"metadata.k" appears twice`},
		{"POST", "/v1/inboxes/x/lease", `{"MAX":1}`, 400, "unknown_field", "MAX"},
		{"POST", "/v1/subscriptions", `{"name":"..","source":"devices"}`, 400, "invalid_field", "dots alone"},
		{"GET", "/v1/subscriptions/..a", ``, 404, "not_found", "..a"},
		// A blank lease token is not an operator's absent one.
		{"POST", "/v1/inboxes/x/ack", `{"ids":[1],"lease":""}`, 400, "invalid_field", "lease: empty"},
		{"POST", "/v1/inboxes/x/nack", `{"ids":[1],"lease":"","dead":true}`, 400, "invalid_field", "lease: empty"},
		{"PATCH", "/v1/subscriptions/webhooks", `{"target":""}`, 400, "invalid_field", "null to remove"},
		{"PATCH", "/v1/subscriptions/webhooks", `{"on_dead_letter":"skip"}`, 400, "invalid_field", "on_dead_letter: only for a subscription with order_by"},
		{"PATCH", "/v1/subscriptions/webhooks", `{"on_dead_letter":1}`, 400, "invalid_json", "on_dead_letter"},
		{"GET", "/v1/streams/devices/events?limit=0", ``, 400, "invalid_field", "limit"},
		{"POST", "/v1/inboxes/x/extend", `{"ids":[1]}`, 400, "missing_field", "lease"},
		{"POST", "/v1/subscriptions", `null`, 400, "invalid_json", "null"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":"customer"}`, 400, "invalid_field", "order_by \"customer\""},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":"metadata."}`, 400, "invalid_field", "order_by"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":"header.a b"}`, 400, "invalid_field", "order_by"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":"/order/~9"}`, 400, "invalid_field", "order_by"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":7}`, 400, "invalid_json", "order_by"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","order_by":"/order/id","on_dead_letter":"retry"}`, 400, "invalid_field", "on_dead_letter"},
		{"POST", "/v1/subscriptions", `{"name":"o","source":"devices","on_dead_letter":"skip"}`, 400, "invalid_field", "on_dead_letter: only with order_by"},
		{"POST", "/v1/subscriptions", `{"name":"a","source":"devices","start_offset":5}`, 400, "invalid_field", "latest, the default"},
		{"GET", "/v1/consumers/a%20b", ``, 400, "invalid_field", "consumer"},
		{"GET", "/webhooks?idempotency_key=k&source=a%20b", ``, 400, "invalid_field", "source"},
		{"GET", "/webhooks?idempotency_key=k&source=nosuch", ``, 404, "not_found", "nosuch"},
		{"GET", "/v1/inboxes/x/items?limit=%zz", ``, 400, "invalid_field", "query"},
		{"POST", "/v1/dead-letters/1/replay", `{"bogus":1}`, 400, "unknown_field", "bogus"},
		{"POST", "/v1/subscriptions/webhooks/enable", `{"bogus":1}`, 400, "unknown_field", "bogus"},
		{"POST", "/v1/sources", `{"name":"p","kind":"poll","settings":{"url":"http://127.0.0.1:1/","items":"/i","id":"/id","type":"/t","interval":5}}`, 400, "invalid_json", `field "interval": want a string`},
		{"POST", "/v1/sources", `{"name":"p","kind":"poll","settings":[]}`, 400, "invalid_json", "settings: want an object"},
		{"POST", "/v1/sources", `{"name":"w","kind":"webhook","settings":{"Preset":"github"}}`, 400, "unknown_field", `"Preset"`},
		{"POST", "/v1/sources", `{"name":"f","kind":"feed","settings":{"url":"http://127.0.0.1:1/v1/streams/devices","bogus":1}}`, 400, "unknown_field", "bogus"},
	} {
		status, body := call(t, ts, c.method, c.path, c.body)
		e, _ := body["error"].(map[string]any)
		code, _ := e["code"].(string)
		msg, _ := e["message"].(string)
		name := c.body
		if len(name) > 80 {
			name = name[:80] + "…"
		}
		if status != c.status || code != c.code || !strings.Contains(msg, c.mentions) {
			t.Errorf("%s %s %s: %d %s %q, want %d %s mentioning %q", c.method, c.path, name, status, code, msg, c.status, c.code, c.mentions)
		}
	}
	// A message that quotes a huge bad value is cut, not the value again.
	long := strings.Repeat("x", 100000)
	status, body := call(t, ts, "POST", "/v1/consumers/webhooks/reset", `{"to_time":"`+long+`"}`)
	if e, _ := body["error"].(map[string]any); status != 400 || len(fmt.Sprint(e["message"])) > 1100 || !strings.Contains(fmt.Sprint(e["message"]), "to_time") {
		t.Errorf("a 100,000-byte bad value: %d, a message of %d bytes, want 400 naming to_time in at most ~1 KiB", status, len(fmt.Sprint(e["message"])))
	}
	// Nothing of the above was created: there is only the default
	// subscription of webhooks.
	if _, body := call(t, ts, "GET", "/v1/subscriptions", ""); len(body["subscriptions"].([]any)) != 1 {
		t.Fatalf("refused requests left subscriptions: %v", body)
	}
}

// TestAPIDeviceEventsToInbox: envelopes sent over the WebSocket ingress
// reach a subscription's inbox, filtered by type and device, and a
// runtime leases, nacks and acks them over HTTP.
func TestAPIDeviceEventsToInbox(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	if status, body := call(t, ts, "POST", "/v1/subscriptions",
		`{"name":"pi7","source":"devices","types":["proposal.*"],"metadata":{"device_id":"pi-7"},"start":"earliest"}`); status != 201 {
		t.Fatalf("create: %d %v", status, body)
	}
	c := dial(t, ts.WS, client.Options{})
	var msgs []client.Message
	for i := range 12 {
		device := []string{"pi-7", "pi-8"}[i%2]
		e := envelope(fmt.Sprintf("evt_api_%02d", i), device, fmt.Sprintf(`{"i":%d}`, i))
		e.Type = "proposal.task"
		if i%3 == 0 {
			e.Type = "telemetry.cpu"
		}
		msgs = append(msgs, message(t, e))
	}
	send(t, c, msgs...)
	// Events 2, 4, 8, 10 are pi-7 proposals (0 and 6 are telemetry).
	waitFor(t, 10*time.Second, "4 items in inbox pi7", func() bool {
		_, body := call(t, ts, "GET", "/v1/inboxes/pi7/items?state=pending", "")
		items, _ := body["items"].([]any)
		return len(items) == 4
	})
	_, body := call(t, ts, "GET", "/v1/inboxes/pi7/items", "")
	for i, raw := range body["items"].([]any) {
		it := raw.(map[string]any)
		want := fmt.Sprintf("evt_api_%02d", []int{2, 4, 8, 10}[i])
		meta, _ := it["metadata"].(map[string]any)
		if it["event_id"] != want || meta["device_id"] != "pi-7" || it["state"] != "pending" || it["stream"] != "devices" {
			t.Fatalf("item %d: %v, want event %s", i, it, want)
		}
	}
	status, lease := call(t, ts, "POST", "/v1/inboxes/pi7/lease", `{"max":3,"visibility_timeout":"1m"}`)
	items, _ := lease["items"].([]any)
	if status != 200 || len(items) != 3 || lease["lease"] == "" {
		t.Fatalf("lease: %d %v", status, lease)
	}
	id := func(i int) int64 { return int64(items[i].(map[string]any)["id"].(float64)) }
	ack := fmt.Sprintf(`{"ids":[%d,%d],"lease":%q}`, id(0), id(1), lease["lease"])
	if status, body := call(t, ts, "POST", "/v1/inboxes/pi7/ack", ack); status != 200 || fmt.Sprint(body["items"]) != fmt.Sprintf("[map[id:%d state:completed] map[id:%d state:completed]]", id(0), id(1)) {
		t.Fatalf("ack: %d %v", status, body)
	}
	nack := fmt.Sprintf(`{"ids":[%d],"lease":%q,"delay":"1h","reason":"model busy"}`, id(2), lease["lease"])
	if status, body := call(t, ts, "POST", "/v1/inboxes/pi7/nack", nack); status != 200 || !strings.Contains(fmt.Sprint(body), "pending") {
		t.Fatalf("nack: %d %v", status, body)
	}
	// The nacked item waits an hour; the fourth was never leased.
	if _, again := call(t, ts, "POST", "/v1/inboxes/pi7/lease", `{"max":10}`); len(again["items"].([]any)) != 1 {
		t.Fatalf("second lease: %v", again)
	}
	if status, body := call(t, ts, "POST", "/v1/inboxes/pi7/ack", ack); status != 200 || !strings.Contains(fmt.Sprint(body), "state:completed") {
		t.Fatalf("second ack of completed items: %d %v", status, body)
	}
	_, inboxes := call(t, ts, "GET", "/v1/inboxes", "")
	for i, in := range inboxes["inboxes"].([]any) {
		in := in.(map[string]any)
		if oldest, ok := in["oldest_pending_at"]; !ok || (oldest == nil) != (i == 1) {
			t.Errorf("inbox %v: oldest_pending_at %v, want a time for pi7's pending item and null for webhooks", in["inbox"], oldest)
		}
		delete(in, "oldest_pending_at")
	}
	if fmt.Sprint(inboxes["inboxes"]) != "[map[completed:2 failed:0 inbox:pi7 pending:1 processing:1] map[completed:0 failed:0 inbox:webhooks pending:0 processing:0]]" {
		t.Fatalf("inboxes: %v", inboxes)
	}
	// Each subscription's share, in the list and a get.
	_, subs := call(t, ts, "GET", "/v1/subscriptions", "")
	var counts []string
	for _, s := range subs["subscriptions"].([]any) {
		counts = append(counts, fmt.Sprint(s.(map[string]any)["counts"]))
	}
	if fmt.Sprint(counts) != "[map[completed:2 failed:0 inbox:pi7 pending:1 processing:1] map[completed:0 failed:0 inbox:webhooks pending:0 processing:0]]" {
		t.Fatalf("subscriptions' counts: %v", counts)
	}
	if _, sub := call(t, ts, "GET", "/v1/subscriptions/pi7", ""); fmt.Sprint(sub["counts"]) != "map[completed:2 failed:0 inbox:pi7 pending:1 processing:1]" {
		t.Fatalf("subscription's counts: %v", sub["counts"])
	}
	_, consumers := call(t, ts, "GET", "/v1/consumers", "")
	cs := consumers["consumers"].([]any)
	if len(cs) != 2 || cs[0].(map[string]any)["subscription"] != "pi7" || cs[0].(map[string]any)["lag"] != float64(0) || cs[0].(map[string]any)["next_offset"] != float64(13) {
		t.Fatalf("consumers: %v", consumers)
	}
	ts.wantMetrics(t, map[string]float64{
		`postbox_subscription_lag_events{stream="devices",subscription="pi7"}`: 0,
		`postbox_subscription_items_total{subscription="pi7"}`:                 4,
		`postbox_inbox_settled_total{inbox="pi7",state="completed"}`:           2,
	})
}

// TestAPIToken: with an API token, the operator API answers 401 without
// it, while /health and the ingress do not need it.
func TestAPIToken(t *testing.T) {
	ts := start(t, server.Config{APIToken: "s3cret"}, nil)
	for _, path := range []string{"/v1/subscriptions", "/v1/streams", "/v1/consumers", "/v1/inboxes", "/v1/inboxes/x/items"} {
		status, body := call(t, ts, "GET", path, "")
		if status != http.StatusUnauthorized || !strings.Contains(fmt.Sprint(body), "unauthorized") || !strings.Contains(fmt.Sprint(body), "this API needs the server's API token") {
			t.Errorf("GET %s without the token: %d %v", path, status, body)
		}
	}
	// A token given and wrong is said to be wrong, not missing.
	req, _ := http.NewRequest("GET", ts.Base+"/v1/streams", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	if resp, err := ts.HTTP.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "the token given is not the server's API token") {
			t.Errorf("GET /v1/streams with a wrong token: %d %s", resp.StatusCode, b)
		}
	}
	for _, c := range []struct {
		auth   string
		status int
	}{
		{"Bearer s3cret", http.StatusOK}, {"bearer s3cret", http.StatusOK}, {"BEARER  s3cret", http.StatusOK}, // the scheme's name has no case (RFC 9110)
		{"Basic s3cret", http.StatusUnauthorized}, {"Bearer s3cre", http.StatusUnauthorized},
		{"Bearers3cret", http.StatusUnauthorized}, {"s3cret", http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("GET", ts.Base+"/v1/streams", nil)
		req.Header.Set("Authorization", c.auth)
		resp, err := ts.HTTP.Do(req)
		if err != nil || resp.StatusCode != c.status {
			t.Fatalf("with %q: %v %v, want %d", c.auth, resp, err, c.status)
		}
		resp.Body.Close()
	}
	if resp, err := ts.HTTP.Get(ts.Base + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health: %v %v", resp, err)
	}
	send(t, dial(t, ts.WS, client.Options{}), message(t, envelope("evt_tok_1", "pi-1", `{}`)))
}

// TestLeaseWaitEndsAtShutdown: a runtime waiting on a lease gets its
// (empty) answer when the server shuts down, instead of holding the
// shutdown up.
func TestLeaseWaitEndsAtShutdown(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	type answer struct {
		status int
		body   map[string]any
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := ts.HTTP.Post(ts.Base+"/v1/inboxes/idle/lease", "application/json", strings.NewReader(`{"wait":"60s"}`))
		if err != nil {
			got <- answer{}
			return
		}
		defer resp.Body.Close()
		var body map[string]any
		json.NewDecoder(resp.Body).Decode(&body)
		got <- answer{resp.StatusCode, body}
	}()
	select { // an empty inbox: the lease is waiting, not answering
	case a := <-got:
		t.Fatalf("the lease answered before its wait: %v", a)
	case <-time.After(300 * time.Millisecond):
	}
	began := time.Now()
	ts.Stop()
	a := <-got
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("shutdown took %v with a waiting lease", took)
	}
	if a.status != http.StatusOK || len(a.body["items"].([]any)) != 0 {
		t.Fatalf("waiting lease at shutdown: %d %v", a.status, a.body)
	}
}
