package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// startServe starts postbox serve on a free port with a SQLite file of
// its own and args, and returns its base URL once /ready answers.
func startServe(t *testing.T, args ...string) (string, *proc) {
	t.Helper()
	addr := freePort(t)
	p := start(t, append([]string{"serve", "--addr", addr, "--db", filepath.Join(t.TempDir(), "postbox.db"), "--log-level", "warn"}, args...)...)
	waitHTTP(t, "http://"+addr+"/ready", p)
	return "http://" + addr, p
}

// webhookAnswer is one POST /webhooks/{source} answered.
type webhookAnswer struct {
	status     int
	retryAfter string
	body       []byte
	at         time.Time // when the answer came
}

// postWebhook posts a webhook under key to base's source.
func postWebhook(hc *http.Client, base, source, key string) (webhookAnswer, error) {
	req, _ := http.NewRequest("POST", base+"/webhooks/"+source, strings.NewReader(`{"n":"`+key+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := hc.Do(req)
	if err != nil {
		return webhookAnswer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return webhookAnswer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: b, at: time.Now()}, nil
}

// flood posts n webhooks to source over the bases in turn from 16
// senders as fast as they are answered, and returns the answers in the
// order they came.
func flood(t *testing.T, bases []string, source, prefix string, n int) []webhookAnswer {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	for _, b := range bases { // warm connections: the flood measures postbox, not dialling
		if r, err := hc.Get(b + "/health"); err == nil {
			r.Body.Close()
		}
	}
	var mu sync.Mutex
	var out []webhookAnswer
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				a, err := postWebhook(hc, bases[i%len(bases)], source, fmt.Sprintf("%s-%d", prefix, i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				out = append(out, a)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// metric returns the sum of the series of /metrics whose line starts with
// prefix (a name and labels, e.g. `postbox_x{source="a"`).
func metric(t *testing.T, base, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err == nil {
				sum += f
			}
		}
	}
	return sum
}

// checkFlood checks a flood of one limited source at 100/s burst 100
// over nodes: the burst of 100 stored, a 429 within the first second,
// no more stored than the bucket allows over the time it took (plus a
// batch of 10 per node of a shared store), and every 429 well-formed.
func checkFlood(t *testing.T, answers []webhookAnswer, start time.Time, nodes int) {
	t.Helper()
	stored, firstRefused := 0, -1
	for i, a := range answers {
		switch a.status {
		case http.StatusAccepted:
			stored++
		case http.StatusTooManyRequests:
			if firstRefused < 0 {
				firstRefused = i
				var e struct {
					Error struct{ Code, Message string }
				}
				json.Unmarshal(a.body, &e)
				if e.Error.Code != "rate_limited" || !strings.Contains(e.Error.Message, "rate_limit: 100/s burst 100") {
					t.Errorf("429 body %s: want code rate_limited naming the limit 100/s burst 100", a.body)
				}
				if a.retryAfter != "1" {
					t.Errorf("429 Retry-After %q, want 1", a.retryAfter)
				}
				if took := a.at.Sub(start); took > time.Second {
					t.Errorf("the first 429 came %v after the first request, want within a second", took)
				}
			}
		default:
			t.Fatalf("webhook answered %d %s", a.status, a.body)
		}
	}
	if firstRefused < 0 {
		t.Fatalf("%d webhooks all stored: the rate limit refused none", len(answers))
	}
	took := answers[len(answers)-1].at.Sub(start).Seconds()
	bound := 100 + 100*took + float64(10*(nodes-1)) + 1
	// A 429 is answered at once and a 202 after its commit, so answers
	// come out of order: the burst is counted, not placed.
	if stored < 100-10*(nodes-1) || float64(stored) > bound {
		t.Fatalf("%d stored of %d in %.2fs: want the burst of 100 and at most %.0f in all", stored, len(answers), took, bound)
	}
	t.Logf("%d of %d webhooks stored in %.2fs (bound %.0f); the first 429 was answer %d", stored, len(answers), took, bound, firstRefused+1)
}

// TestWebhookRateLimitCLI: a source created with --rate-limit 100
// --rate-burst 100 stores the first 100 webhooks of a flood and answers
// 429 rate_limited with Retry-After: 1 within the first second, counted
// in postbox_ingress_rate_limited_total and the throttled result; after
// Retry-After it stores again. Bad values are refused naming the flag or
// the field; sources get shows the limit.
func TestWebhookRateLimitCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	base, _ := startServe(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rate-limit", "-1"}, `invalid value "-1" for flag -rate-limit: "-1" is not a rate`},
		{[]string{"--rate-limit", "fast"}, `"fast" is not a rate`},
		{[]string{"--rate-limit", "0"}, "--rate-limit 0: give events per second above 0"},
		{[]string{"--rate-burst", "5"}, "--rate-burst goes with --rate-limit"},
	} {
		out, errOut, code := runCLI(t, base, append([]string{"sources", "create", "bad"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("sources create %v: exit %d, %s%s; want 2 and %q", c.args, code, out, errOut, c.want)
		}
	}
	resp, err := http.Post(base+"/v1/sources", "application/json", strings.NewReader(`{"name":"bad","kind":"webhook","settings":{"rate_limit":{"per_second":100,"burst":-1}}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), "settings.rate_limit.burst -1") {
		t.Fatalf("a negative burst: %d %s, want 400 naming settings.rate_limit.burst", resp.StatusCode, b)
	}

	// Through the API a burst left out is shown as the one in effect.
	resp, err = http.Post(base+"/v1/sources", "application/json", strings.NewReader(`{"name":"half","kind":"webhook","settings":{"rate_limit":{"per_second":2.5}}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || !strings.Contains(string(b), `"rate_limit":{"per_second":2.5,"burst":3}`) {
		t.Fatalf("a source of 2.5/s: %d %s, want its rate_limit shown with burst 3", resp.StatusCode, b)
	}
	if out, errOut, code := runCLI(t, base, "sources", "create", "rl", "--rate-limit", "100", "--rate-burst", "100"); code != 0 {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	if out, _, _ := runCLI(t, base, "sources", "get", "rl"); !regexp.MustCompile(`rate limit:\s+100/s, burst 100`).MatchString(out) {
		t.Fatalf("sources get shows no rate limit:\n%s", out)
	}
	start := time.Now()
	answers := flood(t, []string{base}, "rl", "a", 160)
	checkFlood(t, answers, start, 1)
	refused := 0
	for _, a := range answers {
		if a.status == http.StatusTooManyRequests {
			refused++
		}
	}
	if got := metric(t, base, `postbox_ingress_rate_limited_total{limit="source",source="rl"}`); got != float64(refused) {
		t.Errorf("postbox_ingress_rate_limited_total{source=rl}: %v, want %d", got, refused)
	}
	if got := metric(t, base, `postbox_ingress_events_total{result="throttled",source="rl"}`); got != float64(refused) {
		t.Errorf("postbox_ingress_events_total{throttled,rl}: %v, want %d", got, refused)
	}
	// After Retry-After the source takes webhooks again.
	time.Sleep(time.Second)
	for i := range 50 {
		a, err := postWebhook(http.DefaultClient, base, "rl", fmt.Sprintf("after-%d", i))
		if err != nil || a.status != http.StatusAccepted {
			t.Fatalf("webhook %d a second after the flood: %v %d %s, want 202", i, err, a.status, a.body)
		}
	}
	// Another source has no limit.
	if out, errOut, code := runCLI(t, base, "sources", "create", "free"); code != 0 {
		t.Fatalf("sources create free: %d %s %s", code, out, errOut)
	}
	for _, a := range flood(t, []string{base}, "free", "f", 150) {
		if a.status != http.StatusAccepted {
			t.Fatalf("a source without a limit answered %d %s", a.status, a.body)
		}
	}
}

// TestTokenRateLimitCLI: with --token-rate-limit 50 --token-rate-burst
// 20 a device token's 120 events are all stored, none refused, but no
// faster than the limit: the connection is held (backpressure), counted
// in postbox_ingress_rate_limited_total{limit="token"} and
// postbox_ingress_rate_limited_seconds_total. Bad values are refused
// naming the flag or variable.
func TestTokenRateLimitCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("tok-a pi-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"--token-rate-limit", "5"}, "", "--token-rate-limit (POSTBOX_TOKEN_RATE_LIMIT) limits each device token: it needs --auth-tokens"},
		{[]string{"--auth-tokens", tokens, "--token-rate-burst", "5"}, "", "--token-rate-burst (POSTBOX_TOKEN_RATE_BURST) goes with --token-rate-limit"},
		{[]string{"--auth-tokens", tokens}, "POSTBOX_TOKEN_RATE_LIMIT=lots", `POSTBOX_TOKEN_RATE_LIMIT`},
		{[]string{"--token-rate-limit", "-3"}, "", `"-3" is not a rate`},
	} {
		cmd := exec.Command(binary, append([]string{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "x.db")}, c.args...)...)
		if c.env != "" {
			cmd.Env = append(os.Environ(), c.env)
		}
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("serve %v %s: %v %s; want exit 2 and %q", c.args, c.env, err, out, c.want)
		}
	}

	base, _ := startServe(t, "--auth-tokens", tokens, "--token-rate-limit", "50", "--token-rate-burst", "20")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/ws", &websocket.DialOptions{
		Subprotocols: []string{"postbox.v1"}, HTTPHeader: http.Header{"Authorization": {"Bearer tok-a"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	start := time.Now()
	const frames, per = 6, 20
	for f := range frames {
		var frame bytes.Buffer
		frame.WriteByte('[')
		for i := range per {
			if i > 0 {
				frame.WriteByte(',')
			}
			fmt.Fprintf(&frame, `{"schema_version":1,"event_id":"e-%d-%d","type":"t","ts":"2026-01-01T00:00:00Z","session_id":"s","device_id":"pi-a","payload":{}}`, f, i)
		}
		frame.WriteByte(']')
		if err := c.Write(ctx, websocket.MessageText, frame.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	stored := 0
	for stored < frames*per {
		_, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("after %d answers: %v", stored, err)
		}
		if bytes.Contains(data, []byte(`"nack"`)) {
			t.Fatalf("a NACK under the token's rate limit: %s", data)
		}
		stored += bytes.Count(data, []byte(`"event_id"`))
	}
	took := time.Since(start)
	// 20 at once, then 100 at 50/s: 2 s.
	if took < 1700*time.Millisecond || took > 15*time.Second {
		t.Fatalf("120 events at 50/s burst 20 took %v, want about 2s", took)
	}
	if got := metric(t, base, `postbox_ingress_rate_limited_total{limit="token",source="devices"}`); got < 80 {
		t.Errorf("postbox_ingress_rate_limited_total{limit=token}: %v, want at least the 80 events beyond the first frames", got)
	}
	if got := metric(t, base, `postbox_ingress_rate_limited_seconds_total`); got < 1.5 {
		t.Errorf("postbox_ingress_rate_limited_seconds_total: %v, want about 2", got)
	}
	t.Logf("120 events at 50/s burst 20 answered in %v", took)
}

// TestClusterWebhookRateLimit: two serve nodes on one PostgreSQL store
// share a source's limit of 100/s burst 100: a flood over both stores
// the burst and then no more than the one bucket allows (plus a batch per
// node), and both nodes answer 429.
func TestClusterWebhookRateLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	store := clusterSchema(t)
	nodes := []*clusterNode{startNode(t, "n1", store, store), startNode(t, "n2", store, store)}
	for _, n := range nodes {
		n.waitReady(nodes)
	}
	if out, errOut, code := runCLI(t, nodes[0].url, "sources", "create", "shared", "--rate-limit", "100", "--rate-burst", "100"); code != 0 {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	time.Sleep(1100 * time.Millisecond) // the other node's cache of sources learns it (sourceCacheTTL)
	start := time.Now()
	answers := flood(t, []string{nodes[0].url, nodes[1].url}, "shared", "c", 300)
	checkFlood(t, answers, start, 2)
	for _, n := range nodes {
		if got := metric(t, n.url, `postbox_ingress_rate_limited_total{limit="source",source="shared"}`); got == 0 {
			t.Errorf("node %s refused none: the limit is not shared", n.name)
		}
	}
}
