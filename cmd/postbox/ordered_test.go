package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
)

// orderTarget is a push target for ordered delivery: each request's body
// is {"k": key, "seq": n}, n from 1 per key. It records what breaks the
// order: a request of a key while another of its seqs is in flight, a
// seq before the last one it answered 200 to (the last one again is a
// redelivery, after a crash lost its ack), or one that skips a seq. It
// fails one request in failEvery with 503 (0: none).
type orderTarget struct {
	srv       *httptest.Server
	mu        sync.Mutex
	inFlight  map[string]map[int]int // key → seq → requests under way
	last      map[string]int         // key → last seq answered 200
	ok, posts int
	errs      []string
	failEvery int
}

func newOrderTarget(t *testing.T, failEvery int) *orderTarget {
	tg := &orderTarget{inFlight: map[string]map[int]int{}, last: map[string]int{}, failEvery: failEvery}
	tg.srv = httptest.NewServer(http.HandlerFunc(tg.serve))
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *orderTarget) serve(w http.ResponseWriter, r *http.Request) {
	var p struct {
		K   string `json:"k"`
		Seq int    `json:"seq"`
	}
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tg.mu.Lock()
	tg.posts++
	for seq, n := range tg.inFlight[p.K] {
		if n > 0 && seq != p.Seq {
			tg.errs = append(tg.errs, fmt.Sprintf("key %s: seq %d sent while seq %d is in flight", p.K, p.Seq, seq))
		}
	}
	switch last := tg.last[p.K]; {
	case p.Seq < last:
		tg.errs = append(tg.errs, fmt.Sprintf("key %s: seq %d sent after seq %d completed", p.K, p.Seq, last))
	case p.Seq > last+1:
		tg.errs = append(tg.errs, fmt.Sprintf("key %s: seq %d sent before seq %d completed", p.K, p.Seq, last+1))
	}
	if tg.inFlight[p.K] == nil {
		tg.inFlight[p.K] = map[int]int{}
	}
	tg.inFlight[p.K][p.Seq]++
	fail := tg.failEvery > 0 && tg.posts%tg.failEvery == 0
	pause := time.Duration(100+tg.posts%400) * time.Microsecond // long enough for others to come in
	tg.mu.Unlock()
	time.Sleep(pause)
	tg.mu.Lock()
	tg.inFlight[p.K][p.Seq]--
	if !fail {
		if p.Seq > tg.last[p.K] {
			tg.last[p.K] = p.Seq
		}
		tg.ok++
	}
	tg.mu.Unlock()
	if fail {
		http.Error(w, "try again", http.StatusServiceUnavailable)
	}
}

func (tg *orderTarget) okCount() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.ok
}

// waitOK waits until the target answered n requests 200.
func (tg *orderTarget) waitOK(t *testing.T, n int) {
	t.Helper()
	testenv.Progressing(t, 2*time.Minute, fmt.Sprintf("%d deliveries", n), func() (bool, int64) {
		ok := tg.okCount()
		return ok >= n, int64(ok)
	})
}

// check fails t on every order the target saw broken, and unless every
// key got its events 1..events.
func (tg *orderTarget) check(t *testing.T, keys, events int) {
	t.Helper()
	tg.mu.Lock()
	defer tg.mu.Unlock()
	for i, e := range tg.errs {
		if i == 20 {
			t.Errorf("… and %d more", len(tg.errs)-20)
			break
		}
		t.Error(e)
	}
	for k := range keys {
		if last := tg.last[orderKey(k)]; last != events {
			t.Errorf("key %s: last seq completed %d, want %d", orderKey(k), last, events)
		}
	}
	t.Logf("target: %d requests, %d answered 200, for %d keys × %d events", tg.posts, tg.ok, keys, events)
}

func orderKey(k int) string { return "order-" + strconv.Itoa(k) }

// orderedSize is the keys and events per key of the ordered crash and
// cluster tests: small in CI, POSTBOX_ORDERED_KEYS and
// POSTBOX_ORDERED_EVENTS by hand (1000 and 50 for a run at scale).
func orderedSize(t *testing.T, keys, events int) (int, int) {
	t.Helper()
	for _, v := range []struct {
		name string
		n    *int
	}{{"POSTBOX_ORDERED_KEYS", &keys}, {"POSTBOX_ORDERED_EVENTS", &events}} {
		if s := os.Getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", v.name, s)
			}
			*v.n = n
		}
	}
	return keys, events
}

// postOrdered posts events webhooks per key to base, each key's in seq
// order, from 8 senders at once.
func postOrdered(t *testing.T, bases []string, keys, events int) {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			base := bases[g%len(bases)]
			for seq := 1; seq <= events; seq++ {
				for k := g; k < keys; k += 8 {
					req, _ := http.NewRequest("POST", base+"/webhooks", bytes.NewBufferString(fmt.Sprintf(`{"k":%q,"seq":%d}`, orderKey(k), seq)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", orderKey(k), seq))
					resp, err := hc.Do(req)
					if err != nil {
						errs <- err
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusAccepted {
						errs <- fmt.Errorf("POST /webhooks %s-%d: %s", orderKey(k), seq, resp.Status)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitSubscriptionDone waits until subscription name at base counts n
// items completed and none pending, processing or failed.
func waitSubscriptionDone(t *testing.T, base func() string, name string, n int) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	var last string
	testenv.Progressing(t, 2*time.Minute, name+" to complete every item", func() (bool, int64) {
		var s struct {
			Counts struct{ Pending, Processing, Completed, Failed int } `json:"counts"`
		}
		resp, err := hc.Get(base() + "/v1/subscriptions/" + name)
		if err != nil {
			return false, -1
		}
		json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
		c := s.Counts
		last = fmt.Sprintf("%+v", c)
		if c.Failed > 0 {
			t.Fatalf("%s: %d dead letters: %s", name, c.Failed, last)
		}
		return c.Completed == n && c.Pending == 0 && c.Processing == 0, int64(c.Completed)
	})
}

// TestCrashOrdered: a push subscription ordered per key, its server
// killed with SIGKILL twice mid-delivery and restarted, to a target that
// fails one request in 20: every key's events reach the target in order,
// each completed, never two of a key in flight.
func TestCrashOrdered(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	keys, events := orderedSize(t, 100, 20)
	total := keys * events
	tg := newOrderTarget(t, 20)
	dir := t.TempDir()
	addr := freePort(t)
	base := "http://" + addr
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn",
		"--workers", "8", "--retry-base-delay", "20ms", "--retry-max-delay", "200ms")
	waitHTTP(t, base+"/ready", srv)
	postOrdered(t, []string{base}, keys, events)
	createSubscription(t, base, fmt.Sprintf(`{"name":"ordered","source":"webhooks","start":"earliest","target":%q,"order_by":"/k"}`, tg.srv.URL))
	for i, at := range []int{total / 3, 2 * total / 3} {
		tg.waitOK(t, at)
		srv.kill()
		t.Logf("kill %d after %d deliveries", i+1, tg.okCount())
		srv.restart()
		waitHTTP(t, base+"/ready", srv)
	}
	waitSubscriptionDone(t, func() string { return base }, "ordered", total)
	tg.check(t, keys, events)
}

// TestClusterOrdered: three nodes on one PostgreSQL schema (delivery
// store and streams) deliver a subscription ordered per key; one is
// killed with SIGKILL mid-way, its items held until their leases end:
// per key, the target sees the events in order and never two at once.
func TestClusterOrdered(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	keys, events := orderedSize(t, 50, 20)
	total := keys * events
	store := clusterSchema(t)
	tg := newOrderTarget(t, 20)
	var nodes []*clusterNode
	for i := range 3 {
		nodes = append(nodes, startNode(t, fmt.Sprintf("n%d", i+1), store, store,
			"--handler-timeout", "2s", "--retry-base-delay", "20ms", "--retry-max-delay", "200ms", "--workers", "8"))
	}
	for _, n := range nodes {
		n.waitReady(nodes)
	}
	postOrdered(t, []string{nodes[0].url, nodes[1].url, nodes[2].url}, keys, events)
	createSubscription(t, nodes[0].url, fmt.Sprintf(`{"name":"ordered","source":"webhooks","start":"earliest","target":%q,"order_by":"/k"}`, tg.srv.URL))
	tg.waitOK(t, total/3)
	nodes[1].kill()
	t.Logf("killed %s after %d deliveries", nodes[1].name, tg.okCount())
	waitSubscriptionDone(t, func() string { return nodes[0].url }, "ordered", total)
	tg.check(t, keys, events)
}
