package deliverypg_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// The tests here run several delivery processes on one PostgreSQL schema,
// as separate postbox nodes would: each its own delivery.Delivery on its
// own deliverypg.Store. Their streams are one streamsqlite backend.

// clock is a settable time source for the items' times; leases of loops
// go by PostgreSQL's clock.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// cluster is a schema, streams and the nodes that share them.
type cluster struct {
	t       *testing.T
	url     string // of the schema
	schema  string
	streams *streamsqlite.Backend
	clock   *clock
	admin   *deliverypg.Store // the test's own connection to the schema
}

// node is one delivery process of a cluster.
type node struct {
	name  string
	store *deliverypg.Store
	d     *delivery.Delivery
	reg   *prometheus.Registry // its metrics and its node gauges
	stop  func()               // ends Run, which releases its leases; the end of the test does too
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	u := testenv.PostgresSchema(t)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, url: u, schema: pu.Query().Get("search_path"), clock: newClock()}
	ctx, cancel := context.WithCancel(context.Background())
	streams, err := streamsqlite.Open(filepath.Join(t.TempDir(), "streams.db"), streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); streams.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; streams.Close() })
	if _, err := streams.EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	c.streams = streams
	c.admin = c.open()
	return c
}

// open connects a new store to the cluster's schema, closed at the end of
// the test.
func (c *cluster) open() *deliverypg.Store {
	c.t.Helper()
	st, err := deliverypg.Open(context.Background(), deliverypg.Config{URL: c.url, Schema: c.schema})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { st.Close() })
	return st
}

// newNode makes a process: its store, delivery.New and Recover, without
// Run.
func (c *cluster) newNode(name string, cfg delivery.Config) *node {
	c.t.Helper()
	n := &node{name: name, store: c.open(), reg: prometheus.NewRegistry()}
	cfg.Node = name
	cfg.Now = c.clock.Now
	cfg.Metrics = delivery.NewMetrics(n.reg)
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	d, err := delivery.New(context.Background(), c.streams, n.store, cfg)
	if err != nil {
		c.t.Fatalf("node %s: %v", name, err)
	}
	n.d = d
	n.reg.MustRegister(d.NodeCollector())
	if _, err := d.Recover(context.Background()); err != nil {
		c.t.Fatalf("node %s: recover: %v", name, err)
	}
	n.stop = func() {}
	return n
}

// start makes a process and runs it until n.stop or the end of the test.
func (c *cluster) start(name string, cfg delivery.Config) *node {
	c.t.Helper()
	n := c.newNode(name, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.d.Run(ctx); err != nil {
			c.t.Errorf("node %s: run: %v", name, err)
		}
	}()
	var once sync.Once
	n.stop = func() { once.Do(func() { cancel(); <-done }) }
	c.t.Cleanup(n.stop) // before the store closes
	return n
}

// loops returns the subscriptions whose loop runs on n, and whether n
// leads, from its gauges.
func (n *node) loops(t *testing.T) (subs []string, leader bool) {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "postbox_subscription_loop_running":
				if m.GetGauge().GetValue() == 1 {
					subs = append(subs, m.GetLabel()[0].GetValue())
				}
			case "postbox_node_leader":
				leader = m.GetGauge().GetValue() == 1
			}
		}
	}
	slices.Sort(subs)
	return subs, leader
}

// has reports whether n has any sample of the metric name.
func (n *node) has(t *testing.T, name string) bool {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return true
		}
	}
	return false
}

// waitLoops waits until the loops of subs run each on one of nodes, want
// of them on each node (when want > 0), and returns the node running
// each.
func (c *cluster) waitLoops(subs []string, want int, nodes ...*node) map[string]*node {
	c.t.Helper()
	var where map[string]*node
	var last string
	settled := func() bool {
		where = map[string]*node{}
		last = ""
		ok := true
		for _, n := range nodes {
			running, _ := n.loops(c.t)
			last += fmt.Sprintf("%s: %v; ", n.name, running)
			if want > 0 && len(running) != want {
				ok = false
			}
			for _, s := range running {
				if where[s] != nil {
					ok = false
				}
				where[s] = n
			}
		}
		for _, s := range subs {
			ok = ok && where[s] != nil
		}
		return ok && len(where) == len(subs)
	}
	for deadline := time.Now().Add(20 * time.Second); !settled(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("the loops did not settle, %d on each node, within 20s: %s leases: %s", want, last, c.leases())
		}
	}
	return where
}

// leases describes the rows of delivery_leases.
func (c *cluster) leases() string {
	c.t.Helper()
	rows, err := c.admin.ReadDB().Query(`SELECT name, node, expires_at > clock_timestamp() FROM delivery_leases ORDER BY name`)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	var out string
	for rows.Next() {
		var name, node string
		var live bool
		if err := rows.Scan(&name, &node, &live); err != nil {
			c.t.Fatal(err)
		}
		out += fmt.Sprintf("%s=%s(live %v) ", name, node, live)
	}
	return out
}

func (c *cluster) appendEvents(prefix string, n int) {
	c.t.Helper()
	var evs []stream.Event
	for i := range n {
		evs = append(evs, stream.Event{NativeID: fmt.Sprintf("%s-%d", prefix, i), Type: "t", OccurredAt: time.Now(),
			Metadata: json.RawMessage(`{}`), Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
	}
	res, err := c.streams.Append(context.Background(), "devices", evs)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil || r.Duplicate {
			c.t.Fatalf("append: %+v", r)
		}
	}
}

// count runs q, a query of one number with $N parameters, on the schema.
func (c *cluster) count(q string, args ...any) int {
	c.t.Helper()
	var n int
	if err := c.admin.ReadDB().QueryRow(q, args...).Scan(&n); err != nil {
		c.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// waitOnce waits until subscription sub holds one item for each offset of
// 1..n, and checks that none is doubled, and that its kept counts count
// each item once.
func (c *cluster) waitOnce(sub string, n int) {
	c.t.Helper()
	c.waitItems(sub, n)
	if got := c.count(`SELECT coalesce(sum(pending + processing + completed + failed), 0) FROM item_counts c
		JOIN subscriptions s ON s.subscription_uid = c.subscription_uid WHERE s.subscription_id = $1`, sub); got != n {
		c.t.Fatalf("%s's kept counts count %d items, want %d", sub, got, n)
	}
}

// waitItems waits until subscription sub holds one item for each offset
// of 1..n, and checks that none is doubled.
func (c *cluster) waitItems(sub string, n int) {
	c.t.Helper()
	testenv.Eventually(c.t, 20*time.Second, fmt.Sprintf("%s to hold %d items", sub, n), func() bool {
		return c.count(`SELECT count(*) FROM inbox_items WHERE subscription_id = $1`, sub) >= n
	})
	if got := c.count(`SELECT count(*) FROM inbox_items WHERE subscription_id = $1`, sub); got != n {
		c.t.Fatalf("%s has %d items, want %d", sub, got, n)
	}
	if got := c.count(`SELECT count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = $1 AND "offset" BETWEEN 1 AND $2`, sub, n); got != n {
		c.t.Fatalf("%s has items of %d distinct offsets of 1..%d", sub, got, n)
	}
}

func create(t *testing.T, n *node, s delivery.Subscription) {
	t.Helper()
	if s.Start.Policy == "" {
		s.Start.Policy = stream.StartEarliest
	}
	if _, created, err := n.d.Create(context.Background(), s); err != nil || !created {
		t.Fatalf("create %s on %s: created=%v %v", s.Name, n.name, created, err)
	}
}

func ids(items []delivery.Item) []int64 {
	var out []int64
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}

// TestConcurrentLeases: runtimes of two processes lease one inbox at once,
// many rounds: no item is handed to two leases at a time, and each settles
// its items through the other process with its lease token; a wrong token
// is refused. Every item ends completed, with as many attempts as leases.
func TestConcurrentLeases(t *testing.T) {
	c := newCluster(t)
	// Attempts enough that no item nacked again and again becomes a dead
	// letter, which would never complete.
	cfg := delivery.Config{MaxAttempts: 1000}
	a, b := c.start("a", cfg), c.start("b", cfg)
	const total = 600
	create(t, a, delivery.Subscription{Name: "jobs", Source: "devices"})
	c.appendEvents("j", total)
	c.waitOnce("jobs", total)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, not a timing
	defer cancel()
	var mu sync.Mutex
	held := map[int64]string{} // item → the lease holding it
	leases := map[int64]int{}  // item → times leased
	var completed atomic.Int64
	var wrong atomic.Bool
	runtime := func(lease, settle *node, r int) error {
		for round := 0; completed.Load() < total && ctx.Err() == nil; round++ {
			l, err := lease.d.Lease(ctx, "jobs", 5, time.Minute, 50*time.Millisecond)
			if err != nil {
				return err
			}
			mu.Lock()
			for _, it := range l.Items {
				if other, ok := held[it.ID]; ok {
					mu.Unlock()
					return fmt.Errorf("item %d leased by %s while %s holds it", it.ID, l.Token, other)
				}
				held[it.ID] = l.Token
				leases[it.ID]++
			}
			mu.Unlock()
			if len(l.Items) == 0 {
				continue
			}
			if len(l.Items) > 1 && wrong.CompareAndSwap(false, true) {
				res, err := settle.d.Ack(ctx, "jobs", ids(l.Items[:1]), "lease_0000")
				if err != nil || !errors.Is(res[0].Err, delivery.ErrLeaseLost) {
					return fmt.Errorf("ack with a wrong token: %+v %v, want ErrLeaseLost", res, err)
				}
			}
			// The items leave the lease before it is settled, so that
			// one leased again at once is not taken for a double.
			mu.Lock()
			for _, it := range l.Items {
				delete(held, it.ID)
			}
			mu.Unlock()
			var res []delivery.Result
			if (round+r)%4 == 0 { // some go back, to be leased again
				res, err = settle.d.Nack(ctx, "jobs", ids(l.Items), l.Token, 0, "again")
			} else {
				res, err = settle.d.Ack(ctx, "jobs", ids(l.Items), l.Token)
			}
			if err != nil {
				return err
			}
			for _, r := range res {
				if r.Err != nil {
					return fmt.Errorf("settle item %d through %s: %v", r.ID, settle.name, r.Err)
				}
				if r.State == delivery.StateCompleted {
					completed.Add(1)
				}
			}
		}
		return nil
	}
	errs := make(chan error, 6)
	var wg sync.WaitGroup
	for r := range 3 {
		for _, ab := range [][2]*node{{a, b}, {b, a}} {
			wg.Go(func() {
				err := runtime(ab[0], ab[1], r)
				if err != nil {
					cancel() // the others stop too: the items this one holds stay leased
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := c.count(`SELECT count(*) FROM inbox_items WHERE state = 'completed'`); n != total {
		t.Fatalf("%d completed items, want %d", n, total)
	}
	items, err := a.d.List(ctx, "jobs", "", 0, total)
	if err != nil {
		t.Fatal(err)
	}
	again := 0
	for _, it := range items {
		if it.Attempts != leases[it.ID] {
			t.Fatalf("item %d: %d attempts, leased %d times", it.ID, it.Attempts, leases[it.ID])
		}
		again += it.Attempts - 1
	}
	if !wrong.Load() || again == 0 {
		t.Fatalf("the runtimes tried no wrong token (%v) or leased no item again (%d)", wrong.Load(), again)
	}
}

// TestLoopsSpread: each subscription's loop runs in one process, the
// processes sharing them fairly, and every event becomes one item.
func TestLoopsSpread(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", delivery.Config{})
	var subs []string
	for i := range 6 {
		subs = append(subs, fmt.Sprint("s", i))
		create(t, a, delivery.Subscription{Name: subs[i], Source: "devices"})
	}
	c.waitLoops(subs, 6, a)
	b, n3 := c.start("b", delivery.Config{}), c.start("c", delivery.Config{})
	c.waitLoops(subs, 2, a, b, n3)
	c.appendEvents("e", 300)
	for _, s := range subs {
		c.waitOnce(s, 300)
	}
	if leaders := c.count(`SELECT count(*) FROM delivery_leases WHERE name = 'leader'`); leaders != 1 {
		t.Fatalf("%d leader leases", leaders)
	}
	n := 0
	for _, x := range []*node{a, b, n3} {
		if _, leader := x.loops(t); leader {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d nodes say they lead, want 1", n)
	}
}

// TestStoppedProcessHandsOver: a process stopped cleanly releases its
// leases as it stops, and the other takes its loops; no event becomes two
// items.
func TestStoppedProcessHandsOver(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", delivery.Config{}), c.start("b", delivery.Config{})
	subs := []string{"s0", "s1", "s2", "s3"}
	for _, s := range subs {
		create(t, a, delivery.Subscription{Name: s, Source: "devices"})
	}
	c.waitLoops(subs, 2, a, b)
	c.appendEvents("before", 100)
	a.stop()
	if n := c.count(`SELECT count(*) FROM delivery_leases WHERE node = 'a'`); n != 0 {
		t.Fatalf("a stopped and holds %d leases", n)
	}
	c.waitLoops(subs, 4, b)
	c.appendEvents("after", 100)
	for _, s := range subs {
		c.waitOnce(s, 200)
	}
}

// TestDeadProcessHandsOver: a process that cannot reach the store stops
// its loops, and once its leases run out the other runs them; no event
// becomes two items.
func TestDeadProcessHandsOver(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", delivery.Config{}), c.start("b", delivery.Config{})
	subs := []string{"s0", "s1", "s2", "s3"}
	for _, s := range subs {
		create(t, a, delivery.Subscription{Name: s, Source: "devices"})
	}
	where := c.waitLoops(subs, 2, a, b)
	dead, live := a, b
	if _, leader := b.loops(t); leader {
		dead, live = b, a // the leader dies
	}
	c.appendEvents("before", 100)
	var mine []string
	for s, n := range where {
		if n == dead {
			mine = append(mine, s)
		}
	}
	for _, s := range mine {
		c.waitOnce(s, 100) // its loops made their items before it died
	}
	dead.store.Close() // every query of the process fails from now on
	testenv.Eventually(t, 10*time.Second, "the dead process to stop its loops", func() bool {
		running, _ := dead.loops(t)
		return len(running) == 0
	})
	c.waitLoops(subs, 4, live)
	if _, leader := live.loops(t); !leader {
		t.Fatal("the live process does not lead")
	}
	c.appendEvents("after", 100)
	for _, s := range subs {
		c.waitOnce(s, 200)
	}
}

// TestChangesReachTheLoop: a subscription created on one process runs
// where its lease is; its target, a Reset and its deletion made on the
// process that does not run its loop take effect on the one that does.
func TestChangesReachTheLoop(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", delivery.Config{}), c.start("b", delivery.Config{})
	ctx := context.Background()
	create(t, a, delivery.Subscription{Name: "s", Source: "devices"})
	owner := c.waitLoops([]string{"s"}, 0, a, b)["s"]
	other := a
	if owner == a {
		other = b
	}
	t.Logf("the loop runs on %s; changes are made on %s", owner.name, other.name)
	c.appendEvents("e", 20)
	c.waitOnce("s", 20)

	// Reset backwards, after items of offsets 11..20 were deleted: the loop
	// makes them again, and only them.
	if _, err := c.admin.ReadDB().Exec(`DELETE FROM inbox_items WHERE "offset" > 10`); err != nil {
		t.Fatal(err)
	}
	if cons, err := other.d.Reset(ctx, "s", stream.Start{Policy: stream.StartAtOffset, Offset: 6}); err != nil || cons.NextOffset != 6 {
		t.Fatalf("reset on %s: %+v %v", other.name, cons, err)
	}
	c.waitItems("s", 20)
	if n := c.count(`SELECT coalesce(sum(pending + processing + completed + failed), 0) FROM item_counts c
		JOIN subscriptions s ON s.subscription_uid = c.subscription_uid WHERE s.subscription_id = 's'`); n != 30 {
		// The 20 counted first (the items deleted above were deleted
		// behind the counts' back), and the 10 made again from offset 6.
		t.Fatalf("the kept counts say %d items, want 30: 20 and the 10 made again from offset 6", n)
	}

	// A target set on the other process: the workers deliver every item.
	var calls atomic.Int64
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer tg.Close()
	if err := other.d.SetTarget(ctx, "s", tg.URL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the target to get every item", func() bool {
		return c.count(`SELECT count(*) FROM inbox_items WHERE state = 'completed'`) == 20
	})
	if calls.Load() != 20 {
		t.Fatalf("the target got %d requests for 20 items", calls.Load())
	}

	// Deleted on the other process: the loop stops where it ran.
	if err := other.d.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the loop to stop", func() bool {
		ra, _ := a.loops(t)
		rb, _ := b.loops(t)
		return len(ra) == 0 && len(rb) == 0 && c.count(`SELECT count(*) FROM delivery_leases WHERE name LIKE 'sub:%'`) == 0
	})
}

// TestRetentionOnTheLeader: retention runs on the leader only.
func TestRetentionOnTheLeader(t *testing.T) {
	c := newCluster(t)
	// A long lease: the leader keeps it for the whole test even when a
	// loaded machine delays a renewal, so the node that ran retention is
	// the one that leads at the end.
	cfg := delivery.Config{Retention: time.Hour, CleanupInterval: 50 * time.Millisecond, LeaseTTL: 30 * time.Second}
	a, b := c.start("a", cfg), c.start("b", cfg)
	settledItems(t, c, a, b, 50, false)
	c.clock.Advance(2 * time.Hour)
	// The deleted items are counted after their delete commits: wait for
	// the count too, not only for the rows to be gone.
	const deleted = "postbox_retention_deleted_total"
	testenv.Eventually(t, 10*time.Second, "retention to delete the completed items and count them", func() bool {
		return c.count(`SELECT count(*) FROM inbox_items`) == 0 && (a.has(t, deleted) || b.has(t, deleted))
	})
	leader, follower := a, b
	if _, lead := b.loops(t); lead {
		leader, follower = b, a
	}
	if _, lead := leader.loops(t); !lead {
		t.Fatal("no process leads")
	}
	if !leader.has(t, deleted) {
		t.Fatalf("the leader %s did not run retention", leader.name)
	}
	if follower.has(t, deleted) {
		t.Fatalf("%s, not the leader, ran retention", follower.name)
	}
}

// TestRecoverLeavesLiveLeases: a process starting beside a live one
// returns to pending the items whose lease expired, not those the live
// one holds, which it then acks with its token.
func TestRecoverLeavesLiveLeases(t *testing.T) {
	c := newCluster(t)
	cfg := delivery.Config{ReapInterval: time.Hour} // Recover, not the reaper, finds the expired leases
	a := c.start("a", cfg)
	create(t, a, delivery.Subscription{Name: "s", Source: "devices"})
	c.appendEvents("e", 5)
	c.waitOnce("s", 5)
	ctx := context.Background()
	short, err := a.d.Lease(ctx, "s", 2, 10*time.Second, 0)
	if err != nil || len(short.Items) != 2 {
		t.Fatalf("lease: %+v %v", short, err)
	}
	long, err := a.d.Lease(ctx, "s", 3, time.Hour, 0)
	if err != nil || len(long.Items) != 3 {
		t.Fatalf("lease: %+v %v", long, err)
	}
	c.clock.Advance(time.Minute)
	b := c.newNode("b", cfg) // its Recover
	if n := c.count(`SELECT count(*) FROM inbox_items WHERE state = 'pending' AND attempts = 1`); n != 2 {
		t.Fatalf("%d items pending again after b's recover, want the 2 whose lease expired", n)
	}
	res, err := a.d.Ack(ctx, "s", ids(long.Items), long.Token)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("ack of an item a holds after b's recover: %v", r.Err)
		}
	}
	if res, _ := b.d.Ack(ctx, "s", ids(short.Items), short.Token); !errors.Is(res[0].Err, delivery.ErrLeaseLost) {
		t.Fatalf("ack with the expired lease: %+v", res)
	}
}

// TestStartTogether: processes that start at the same moment on an empty
// schema all migrate it, once.
func TestStartTogether(t *testing.T) {
	c := newCluster(t) // its admin store does not migrate
	const n = 4
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		st := c.open()
		go func() {
			<-start
			_, err := delivery.New(context.Background(), c.streams, st, delivery.Config{Node: fmt.Sprint("n", i)})
			errs <- err
		}()
	}
	close(start)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	all := c.count(`SELECT count(*) FROM postbox_migrations WHERE component = 'delivery'`)
	if distinct := c.count(`SELECT count(DISTINCT version) FROM postbox_migrations WHERE component = 'delivery'`); all == 0 || all != distinct {
		t.Fatalf("delivery's migrations recorded %d times for %d versions, want each once", all, distinct)
	}
	d := c.newNode("after", delivery.Config{})
	if _, err := d.d.Subscriptions(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionSparesAReplayedItem: an item replayed while retention's
// delete waits for its row is not deleted. The delete chose the item while
// it was completed; the replay committed first, and the delete checks the
// state again on the row it then locks.
func TestRetentionSparesAReplayedItem(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", delivery.Config{Retention: -1})
	item := settledItems(t, c, a, a, 1, false)[0]
	err := c.afterHeldUpdate(`DELETE FROM inbox_items`, `UPDATE inbox_items SET state = 'pending', updated_at = $1 WHERE item_id = $2`,
		[]any{c.clock.Now().Add(3 * time.Hour).Format(time.RFC3339Nano), item}, func() error {
			_, err := a.d.Cleanup(context.Background(), c.clock.Now().Add(2*time.Hour))
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	if n := c.count(`SELECT count(*) FROM inbox_items WHERE state = 'pending'`); n != 1 {
		t.Fatalf("after the replay and retention, %d pending items, want the replayed one", n)
	}
}

// TestReplayOnce: a dead letter that two replays chose at once is
// replayed once: the second, which waited for the row, finds it pending.
func TestReplayOnce(t *testing.T) {
	c := newCluster(t)
	a := c.start("a", delivery.Config{Retention: -1})
	item := settledItems(t, c, a, a, 1, true)[0]
	var replayed []int64
	err := c.afterHeldUpdate(`UPDATE inbox_items SET state = 'pending'`, `UPDATE inbox_items SET state = 'pending', replays = replays + 1 WHERE item_id = $1`,
		[]any{item}, func() error {
			var err error
			replayed, err = a.d.Replay(context.Background(), delivery.DeadLetters{})
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(replayed) != 0 || c.count(`SELECT replays FROM inbox_items WHERE item_id = $1`, item) != 1 {
		t.Fatalf("the second replay replayed %v; replays = %d, want 1", replayed, c.count(`SELECT replays FROM inbox_items WHERE item_id = $1`, item))
	}
}

// settledItems makes n items of a new subscription "s" on leaser, which
// leases them, and has acker ack them, or dead-letter them; it returns
// their ids.
func settledItems(t *testing.T, c *cluster, leaser, acker *node, n int, dead bool) []int64 {
	t.Helper()
	create(t, leaser, delivery.Subscription{Name: "s", Source: "devices"})
	c.appendEvents("e", n)
	c.waitOnce("s", n)
	ctx := context.Background()
	l, err := leaser.d.Lease(ctx, "s", n, time.Minute, 0)
	if err != nil || len(l.Items) != n {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	if dead {
		_, err = acker.d.NackDead(ctx, "s", ids(l.Items), l.Token, "refused")
	} else {
		_, err = acker.d.Ack(ctx, "s", ids(l.Items), l.Token)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ids(l.Items)
}

// afterHeldUpdate runs update in a transaction of its own, runs fn beside
// it until fn's statement starting with waiter waits for the rows update
// locked, then commits update and returns fn's error.
func (c *cluster) afterHeldUpdate(waiter, update string, args []any, fn func() error) error {
	c.t.Helper()
	ctx := context.Background()
	tx, err := c.admin.ReadDB().BeginTx(ctx, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, update, args...); err != nil {
		c.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fn() }()
	testenv.Eventually(c.t, 10*time.Second, "a statement to wait for the held rows", func() bool {
		return c.count(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.query LIKE $1`, waiter+"%") > 0
	})
	if err := tx.Commit(); err != nil {
		c.t.Fatal(err)
	}
	return <-done
}

// TestPauseAcrossNodes: a subscription paused through one process is
// paused in every process of the store: a runtime's lease on another one
// gets none of its items, its loop (wherever it runs) keeps filling its
// inbox, and a resume through the other process wakes a lease waiting on
// the first.
func TestPauseAcrossNodes(t *testing.T) {
	c := newCluster(t)
	a, b := c.start("a", delivery.Config{}), c.start("b", delivery.Config{})
	create(t, a, delivery.Subscription{Name: "jobs", Source: "devices"})
	ctx := context.Background()
	if _, err := a.d.Pause(ctx, "jobs", "across nodes"); err != nil {
		t.Fatal(err)
	}
	c.appendEvents("p", 5)
	c.waitItems("jobs", 5)
	for _, n := range []*node{a, b} {
		if l, err := n.d.Lease(ctx, "jobs", 10, time.Minute, 0); err != nil || len(l.Items) != 0 {
			t.Fatalf("lease on %s while paused: %d items, %v, want none", n.name, len(l.Items), err)
		}
		if s, err := n.d.Subscription(ctx, "jobs"); err != nil || s.PausedReason != "across nodes" {
			t.Fatalf("the subscription on %s: %+v %v", n.name, s, err)
		}
	}
	got := make(chan delivery.Lease, 1)
	go func() {
		l, _ := a.d.Lease(ctx, "jobs", 10, time.Minute, 30*time.Second)
		got <- l
	}()
	if _, err := b.d.Resume(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if len(l.Items) != 5 {
			t.Fatalf("the lease on a after the resume on b: %d items, want 5", len(l.Items))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a lease waiting on a got nothing within 20s of the resume on b")
	}
}
