package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestClusterLimits runs three postbox serve nodes on one PostgreSQL
// schema, with two subscriptions of one backlog: one whose endpoint has
// --rate 50/s, one whose slow endpoint has --concurrency 4. The targets
// see the limits of the cluster, not three times them: 50/s ± 10 % over
// the window, and never more than 4 requests in flight. Half-way, the node
// holding the most concurrency slots is killed with SIGKILL: the limits
// hold on, and its slots come back once its lease ends.
//
// POSTBOX_LIMITS_WINDOW sets the window the rate is measured over
// (default 12s); BENCHMARKS.md has a run of 60s.
func TestClusterLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	window := 12 * time.Second
	if s := os.Getenv("POSTBOX_LIMITS_WINDOW"); s != "" {
		var err error
		if window, err = time.ParseDuration(s); err != nil || window < 4*time.Second {
			t.Fatalf("POSTBOX_LIMITS_WINDOW=%q: want a duration of 4s or more", s)
		}
	}
	const (
		rate        = 50.0
		concurrency = 4
		warmup      = 2 * time.Second // from the first request: the bucket's burst goes out, then the rate holds
		leaseTTL    = 5 * time.Second // delivery.DefaultLeaseTTL
	)
	store := clusterSchema(t)
	ns := natstest.StartServer(t, natstest.Options{})
	streams := ns.URL() + fmt.Sprintf("?prefix=LIMITS_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9)
	tg := newLimitTarget(t)

	var nodes []*clusterNode
	for i := range 3 {
		nodes = append(nodes, startNode(t, fmt.Sprintf("n%d", i+1), store, streams, "--workers", "8", "--handler-timeout", "5s"))
	}
	for _, n := range nodes {
		n.waitReady(nodes)
	}

	// A backlog that outlasts the window at either limit.
	events := int(rate * 1.2 * (window + warmup + 4*time.Second).Seconds())
	postWebhooks(t, nodes, events)
	createSubscription(t, nodes[0].url, fmt.Sprintf(`{"name":"rated","source":"webhooks","start":"earliest","target":%q,"rate":"50/s"}`,
		tg.srv.URL+"/rated"))
	createSubscription(t, nodes[1].url, fmt.Sprintf(`{"name":"bounded","source":"webhooks","start":"earliest","target":%q,"concurrency":%d}`,
		tg.srv.URL+"/bounded", concurrency))

	first := tg.waitFirst(t, "/rated", 30*time.Second)
	from, to := first.Add(warmup), first.Add(warmup+window)
	time.Sleep(time.Until(from))
	trips := bucketTrips(t, store)

	// Half-way through the window, the node holding the most slots dies.
	time.Sleep(time.Until(from.Add(window / 2)))
	victim := slotHolder(t, store, nodes)
	victim.kill()
	killed := time.Now()
	t.Logf("killed %s with SIGKILL %.1fs into the window", victim.name, killed.Sub(from).Seconds())
	time.Sleep(time.Until(to) + 200*time.Millisecond)

	n := tg.arrivals("/rated", from, to)
	got := float64(n) / window.Seconds()
	t.Logf("rated: %d requests in %v: %.2f/s (limit %.0f/s, 3 nodes, one killed half-way)", n, window, got, rate)
	// What the bucket cost: its row's updates (tokens taken, even none,
	// and given back), as PostgreSQL's statistics count them (a second
	// or so behind).
	trips = bucketTrips(t, store) - trips
	t.Logf("rated: %d updates of the bucket in the window, %.1f/s over the nodes", trips, float64(trips)/window.Seconds())
	if got < rate*0.9 || got > rate*1.1 {
		t.Errorf("the target saw %.2f requests a second over %v, want %.0f ± 10%%", got, window, rate)
	}
	// Each half alone too, looser (shorter): unlimited, the nodes would
	// have sent the backlog in the first half, and the whole window could
	// still average near the limit.
	for i, half := range [][2]time.Time{{from, from.Add(window / 2)}, {from.Add(window / 2), to}} {
		got := float64(tg.arrivals("/rated", half[0], half[1])) / (window / 2).Seconds()
		t.Logf("rated, half %d: %.2f/s", i+1, got)
		if got < rate*0.8 || got > rate*1.2 {
			t.Errorf("the target saw %.2f requests a second in half %d of the window, want %.0f ± 20%%", got, i+1, rate)
		}
	}
	most, back := tg.inflight("/bounded", killed.Add(200*time.Millisecond))
	if back.IsZero() {
		t.Logf("bounded: at most %d requests in flight (limit %d); never %d again after the kill", most, concurrency, most)
	} else {
		t.Logf("bounded: at most %d requests in flight (limit %d); %d in flight again %v after the kill", most, concurrency, most,
			back.Sub(killed).Round(10*time.Millisecond))
	}
	if most > concurrency {
		t.Errorf("the target saw %d requests in flight at once, want %d at most", most, concurrency)
	}
	if most < concurrency {
		t.Errorf("the target saw %d requests in flight at most, want %d: the limit is not reached, so not tested", most, concurrency)
	}
	switch {
	case back.IsZero():
		t.Errorf("after the kill, never %d requests in flight again, want within the lease TTL (%v) and 3s: the dead node's slots did not come back",
			concurrency, leaseTTL)
	case back.Sub(killed) > leaseTTL+3*time.Second:
		t.Errorf("after the kill, %d requests in flight again %v later, want within the lease TTL (%v) and 3s: the dead node's slots came back late",
			concurrency, back.Sub(killed), leaseTTL)
	}
}

// postWebhooks posts n webhooks to the nodes, a few at a time.
func postWebhooks(t *testing.T, nodes []*clusterNode, n int) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	keys := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for w := range 8 {
		wg.Go(func() {
			for i := range keys {
				node := nodes[(w+i)%len(nodes)]
				req, _ := http.NewRequest("POST", node.url+"/webhooks", strings.NewReader(fmt.Sprintf(`{"n":%d}`, i)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprintf("limit-%06d", i))
				resp, err := hc.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode/100 != 2 {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%d: %v %v", i, err, resp))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d of %d webhooks not accepted, first %s", len(failed), n, failed[0])
	}
}

// slotHolder returns the live node holding the most concurrency slots of
// an endpoint in the store, or the first live node if none holds any.
func slotHolder(t *testing.T, store string, nodes []*clusterNode) *clusterNode {
	t.Helper()
	u, _ := url.Parse(store)
	conn, err := pgx.Connect(context.Background(), testenv.URL(t, testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var holder string
	err = conn.QueryRow(context.Background(), `SELECT holder FROM `+pgx.Identifier{u.Query().Get("schema"), "endpoint_slots"}.Sanitize()+
		` GROUP BY holder ORDER BY count(*) DESC LIMIT 1`).Scan(&holder)
	if err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !n.down && strings.HasPrefix(holder, n.name+"/") {
			t.Logf("%s holds the most concurrency slots", n.name)
			return n
		}
	}
	t.Logf("no node holds a concurrency slot (%q)", holder)
	return nodes[0]
}

// bucketTrips returns how many times the rows of endpoint_rates were
// updated, by PostgreSQL's statistics.
func bucketTrips(t *testing.T, store string) int64 {
	t.Helper()
	u, _ := url.Parse(store)
	conn, err := pgx.Connect(context.Background(), testenv.URL(t, testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int64
	if err := conn.QueryRow(context.Background(), `SELECT coalesce(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'endpoint_rates'`,
		u.Query().Get("schema")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// limitTarget counts, per path, when requests arrive and when they end.
type limitTarget struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs map[string][]span
}

type span struct{ start, end time.Time }

func newLimitTarget(t *testing.T) *limitTarget {
	tg := &limitTarget{reqs: map[string][]span{}}
	tg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if r.URL.Path == "/bounded" {
			time.Sleep(100 * time.Millisecond) // slow: 4 at a time make 40/s
		}
		tg.mu.Lock()
		tg.reqs[r.URL.Path] = append(tg.reqs[r.URL.Path], span{start, time.Now()})
		tg.mu.Unlock()
	}))
	t.Cleanup(tg.srv.Close)
	return tg
}

// waitFirst waits for the first request to path and returns when it came.
func (tg *limitTarget) waitFirst(t *testing.T, path string, within time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		tg.mu.Lock()
		reqs := tg.reqs[path]
		tg.mu.Unlock()
		if len(reqs) > 0 {
			return slices.MinFunc(reqs, func(a, b span) int { return a.start.Compare(b.start) }).start
		}
	}
	t.Fatalf("no request to %s within %v", path, within)
	return time.Time{}
}

// arrivals counts the requests to path that arrived in [from, to).
func (tg *limitTarget) arrivals(path string, from, to time.Time) int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	n := 0
	for _, r := range tg.reqs[path] {
		if !r.start.Before(from) && r.start.Before(to) {
			n++
		}
	}
	return n
}

// inflight returns the most requests to path in flight at once, and the
// first moment after since at which that many were in flight (zero: none).
func (tg *limitTarget) inflight(path string, since time.Time) (most int, at time.Time) {
	tg.mu.Lock()
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, r := range tg.reqs[path] {
		edges = append(edges, edge{r.start, 1}, edge{r.end, -1})
	}
	tg.mu.Unlock()
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // an end before a start at the same moment
	})
	n := 0
	for _, e := range edges {
		n += e.d
		most = max(most, n)
	}
	n = 0
	for _, e := range edges {
		n += e.d
		if n == most && e.at.After(since) {
			return most, e.at
		}
	}
	return most, time.Time{}
}
