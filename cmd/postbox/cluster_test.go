package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/dedup"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

// clusterSub is the subscription of the devices source whose items the
// cluster's workers POST to the test's target.
const clusterSub = "devices-target"

// TestCluster runs three postbox serve nodes on one PostgreSQL schema and
// a three-node JetStream cluster (R3). Agents send events to different
// nodes, webhooks go to random nodes (some to two at once, some to one and
// then another under the same key), and the workers of every node POST the
// items to a target that completes each key once through package dedup.
// Meanwhile the node running the subscription's loop is killed with
// SIGKILL (another node takes the loop over) and one NATS server is shut
// down and started again. At the end every event an agent accepted and
// every webhook answered 2xx is in its stream once, every item is
// completed, the target completed each event once, and each loop runs on
// exactly one live node.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	store := clusterSchema(t)
	ns := natstest.StartCluster(t, 3)
	prefix := fmt.Sprintf("CLUSTER_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9)
	streams := ns.URL() + "?replicas=3&prefix=" + prefix
	tg := newDedupTarget(t)

	var nodes []*clusterNode
	for i := range 3 {
		nodes = append(nodes, startNode(t, fmt.Sprintf("n%d", i+1), store, streams,
			"--handler-timeout", "2s", "--retry-base-delay", "100ms", "--retry-max-delay", "1s",
			"--webhook-target", tg.srv.URL, "--workers", "8"))
	}
	for _, n := range nodes {
		n.waitReady(nodes)
	}
	createSubscription(t, nodes[0].url, fmt.Sprintf(`{"name":%q,"source":"devices","start":"earliest","target":%q}`, clusterSub, tg.srv.URL))

	// Agents, one per node, and webhook senders over every node.
	dir := t.TempDir()
	agents := map[string]*proc{}
	var producers []*pacedProducer
	for i, n := range nodes {
		device := "pi-" + strconv.Itoa(i)
		listen := freePort(t)
		a := start(t, "agent", "--server", "ws://"+n.addr, "--outbox", filepath.Join(dir, device+".db"), "--device-id", device,
			"--listen", listen, "--backoff-max", "200ms", "--log-level", "warn")
		waitHTTP(t, "http://"+listen+"/health", a)
		agents["http://"+listen] = a
		producers = append(producers, &pacedProducer{url: "http://" + listen, device: device})
	}
	ws := &webhookSenders{nodes: nodes}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for _, pr := range producers {
		wg.Go(func() { pr.run(ctx) })
	}
	for w := range 2 {
		wg.Go(func() { ws.run(ctx, t, w) })
	}
	stopTraffic := func() {
		stop()
		wg.Wait()
	}
	defer stopTraffic()

	// Items flow through the cluster before anything goes wrong.
	began, mark := time.Now(), time.Now()
	phase := func(what string) {
		t.Logf("%6.1fs (+%.1fs) %s", time.Since(began).Seconds(), time.Since(mark).Seconds(), what)
		mark = time.Now()
	}
	tg.waitCompleted(t, 100)
	phase("traffic flows")

	// SIGKILL the node that runs the subscription's loop.
	// The target holds deliveries meanwhile, so that the node dies with
	// items in flight: they come back when their leases end.
	owner := waitLoopOwner(t, nodes, clusterSub)
	tg.setSlow(true)
	for deadline := time.Now().Add(30 * time.Second); tg.inFlight() < 12; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries in flight at the target, want 12", tg.inFlight())
		}
	}
	t.Logf("subscription %s runs on %s; killing it with SIGKILL (%d deliveries in flight)", clusterSub, owner.name, tg.inFlight())
	owner.kill()
	killed := time.Now()
	tg.setSlow(false)
	heir := waitLoopOwner(t, nodes, clusterSub)
	t.Logf("failover: the loop of %s runs on %s %v after the SIGKILL of %s", clusterSub, heir.name, time.Since(killed).Round(time.Millisecond), owner.name)
	before := tg.completedCount()
	tg.waitCompleted(t, before+50) // the cluster works on without the node
	phase("the cluster works on without the killed node")

	// One NATS server goes down under the running cluster and comes back.
	down := ns.Nodes[rand.IntN(len(ns.Nodes))]
	t.Logf("shutting down NATS server %s", down.Server().Name())
	down.Shutdown()
	ws.waitAcked(t, ws.ackedCount()+100) // webhooks are stored with two of three NATS servers
	phase("webhooks stored with a NATS server down")
	tg.waitCompleted(t, tg.completedCount()+200)
	phase("items delivered with a NATS server down")
	down.Restart()
	ns.WaitLeader(t)
	phase("NATS server back")

	// The killed node comes back, so that its agent's outbox drains.
	owner.start()
	owner.waitReady(nodes)
	phase("killed node back")
	ws.waitAcked(t, ws.ackedCount()+20)
	stopTraffic()
	drained(t, agents)
	phase("traffic stopped, agents drained")

	// Every accepted event and every acked webhook is stored once.
	devices, webhooks := auditClusterStreams(t, streams, producers, ws)

	// Every item is completed, none stuck in processing.
	phase("streams audited")
	waitInboxesDone(t, nodes, map[string]int{clusterSub: len(devices), "webhooks": len(webhooks)})
	phase("every item completed")
	tg.check(t, devices, webhooks)

	// Each loop runs on exactly one live node.
	waitLoopsOnce(t, nodes, clusterSub, "webhooks")
	for _, n := range nodes {
		lines := append(logLines(n, "level=WARN"), logLines(n, "level=ERROR")...)
		t.Logf("%s: %d warnings and errors logged%s", n.name, len(lines), strings.Join(append([]string{""}, lines[:min(len(lines), 8)]...), "\n  "))
	}
}

// TestClusterStartTogether starts two nodes at the same moment on an
// empty schema: both migrate it (once, under the advisory lock) and come
// up, and exactly one runs the loop of the default subscription webhooks.
func TestClusterStartTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test runs the real binary")
	}
	store := clusterSchema(t)
	ns := natstest.StartServer(t, natstest.Options{})
	streams := ns.URL() + fmt.Sprintf("?prefix=TOGETHER_%d_%d_", os.Getpid(), time.Now().UnixNano()%1e9)
	var nodes []*clusterNode
	for i := range 2 {
		nodes = append(nodes, startNode(t, fmt.Sprintf("n%d", i+1), store, streams))
	}
	for _, n := range nodes {
		n.waitReady(nodes)
	}
	waitLoopsOnce(t, nodes, "webhooks")
	for _, n := range nodes {
		if errs := logLines(n, "level=ERROR"); len(errs) > 0 {
			t.Errorf("node %s logged errors while starting:\n%s", n.name, strings.Join(errs, "\n"))
		}
	}
	// The schema holds one row per component, at its last version.
	u, _ := url.Parse(store)
	schema := u.Query().Get("schema")
	conn, err := pgx.Connect(context.Background(), testenv.URL(t, testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT component, version FROM `+pgx.Identifier{schema, "postbox_migrations"}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	comps := map[string]int{}
	for rows.Next() {
		var c string
		var v int
		if err := rows.Scan(&c, &v); err != nil {
			t.Fatal(err)
		}
		comps[c] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(comps) == 0 {
		t.Fatalf("postbox_migrations of schema %s is empty", schema)
	}
	t.Logf("migrations in schema %s: %v", schema, comps)
}

// clusterSchema returns the --store URL of a new PostgreSQL schema, which
// is dropped when the test ends.
func clusterSchema(t *testing.T) string {
	t.Helper()
	dsn := testenv.URL(t, testenv.Postgres)
	schema := fmt.Sprintf("cluster_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() { testenv.DropSchema(t, dsn, schema) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// clusterNode is one postbox serve process of a cluster. Its log is
// safe to read while the process writes it.
type clusterNode struct {
	t               *testing.T
	name, addr, url string
	args            []string
	cmd             *exec.Cmd
	log             *testenv.Buffer
	down            bool // killed, not yet restarted
}

func startNode(t *testing.T, name, store, streams string, args ...string) *clusterNode {
	t.Helper()
	addr := freePort(t)
	n := &clusterNode{t: t, name: name, addr: addr, url: "http://" + addr, log: &testenv.Buffer{},
		args: append([]string{"serve", "--addr", addr, "--db", filepath.Join(t.TempDir(), "postbox.db"),
			"--store", store, "--streams", streams, "--node", name, "--log-level", "info", "--log-format", "text"}, args...)}
	n.start()
	t.Cleanup(n.kill)
	return n
}

// start starts the process (again), its log going on after the old one.
func (n *clusterNode) start() {
	n.t.Helper()
	n.cmd = exec.Command(binary, n.args...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.down = false
}

// kill sends SIGKILL and reaps the process.
func (n *clusterNode) kill() {
	if n.cmd != nil {
		n.cmd.Process.Signal(syscall.SIGKILL)
		n.cmd.Wait()
		n.cmd = nil
	}
	n.down = true
}

// waitReady waits until the node's /ready answers 200.
func (n *clusterNode) waitReady(nodes []*clusterNode) {
	n.t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := hc.Get(n.url + "/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("node %s not ready within 60s%s", n.name, nodeLogs(nodes))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func createSubscription(t *testing.T, base, body string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/subscriptions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("create subscription %s: %s %s", body, resp.Status, b)
	}
}

var loopRunning = regexp.MustCompile(`(?m)^postbox_subscription_loop_running\{subscription="([^"]+)"\} (\S+)$`)

// loops returns the subscriptions whose loop runs on the node, by its
// /metrics.
func (n *clusterNode) loops() (map[string]bool, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(n.url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	running := map[string]bool{}
	for _, m := range loopRunning.FindAllStringSubmatch(string(b), -1) {
		if m[2] == "1" {
			running[m[1]] = true
		}
	}
	return running, nil
}

// waitLoopOwner waits until exactly one live node runs sub's loop and
// returns it.
func waitLoopOwner(t *testing.T, nodes []*clusterNode, sub string) *clusterNode {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var owners []*clusterNode
		for _, n := range nodes {
			if n.down {
				continue
			}
			if l, err := n.loops(); err == nil && l[sub] {
				owners = append(owners, n)
			}
		}
		if len(owners) == 1 {
			return owners[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live nodes run the loop of %s, want 1%s", len(owners), sub, nodeLogs(nodes))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLoopsOnce waits until each of subs runs on exactly one live node,
// summed over the nodes' /metrics, and fails if that never holds.
func waitLoopsOnce(t *testing.T, nodes []*clusterNode, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		count := map[string]int{}
		where := map[string][]string{}
		for _, n := range nodes {
			if n.down {
				continue
			}
			l, err := n.loops()
			if err != nil {
				continue
			}
			for s := range l {
				count[s]++
				where[s] = append(where[s], n.name)
			}
		}
		ok := true
		for _, s := range subs {
			if count[s] != 1 {
				ok = false
			}
		}
		if ok {
			t.Logf("loops: %v", where)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("loops run on %v, want each of %v on exactly one live node%s", where, subs, nodeLogs(nodes))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nodeLogs(nodes []*clusterNode) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "\n--- log of %s (down: %v):\n%s", n.name, n.down, tail(n.log.String(), 60))
	}
	return b.String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dedupTarget is an HTTP target that counts the deliveries of each
// Idempotency-Key and completes each key once through package dedup on
// PostgreSQL, as a receiver would.
type dedupTarget struct {
	srv       *httptest.Server
	pool      *pgxpool.Pool
	mu        sync.Mutex
	seen      map[string]int  // deliveries, by key
	completed map[string]bool // keys dedup answered done: ran now, or had (effects are counted in target_effects)
	failures  int             // dedup answered an error
	retries   int             // deliveries with X-Postbox-Attempt above 1
	slow      bool            // hold each delivery a while, so that workers have items in flight
}

func newDedupTarget(t *testing.T) *dedupTarget {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, dedup.PostgresSchema); err != nil {
		t.Fatal(err)
	}
	// The handler's effect, written in dedup's transaction: it counts
	// what ran even when the answer was lost (a node killed while the
	// commit was on its way gets an error for a commit that happened).
	if _, err := pool.Exec(ctx, `CREATE TABLE target_effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	tg := &dedupTarget{pool: pool, seen: map[string]int{}, completed: map[string]bool{}}
	tg.srv = httptest.NewServer(http.HandlerFunc(tg.serve))
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *dedupTarget) serve(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	tg.mu.Lock()
	tg.seen[key]++
	if r.Header.Get("X-Postbox-Attempt") != "1" {
		tg.retries++
	}
	hold := time.Duration(rand.IntN(20)) * time.Millisecond // in flight for a while, as a handler is
	if tg.slow {
		hold = 500 * time.Millisecond
	}
	tg.mu.Unlock()
	select {
	case <-time.After(hold):
	case <-r.Context().Done(): // the node died holding it
		return
	}
	// Whether this delivery ran the handler or found the key done by an
	// earlier one (whose answer may have been lost), the key is complete.
	_, err := dedup.HandlePgx(r.Context(), tg.pool, "cluster-target", key, func(tx pgx.Tx) error {
		_, err := tx.Exec(r.Context(), `INSERT INTO target_effects (key) VALUES ($1)`, key)
		return err
	})
	if err != nil {
		tg.mu.Lock()
		tg.failures++
		tg.mu.Unlock()
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	tg.mu.Lock()
	tg.completed[key] = true
	tg.mu.Unlock()
}

func (tg *dedupTarget) completedCount() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return len(tg.completed)
}

// setSlow holds every delivery for 500ms while on.
func (tg *dedupTarget) setSlow(on bool) {
	tg.mu.Lock()
	tg.slow = on
	tg.mu.Unlock()
}

// inFlight returns how many deliveries the target has seen but not
// completed.
func (tg *dedupTarget) inFlight() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	n := 0
	for k := range tg.seen {
		if !tg.completed[k] {
			n++
		}
	}
	return n
}

// waitCompleted waits until the target completed at least n keys.
func (tg *dedupTarget) waitCompleted(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for tg.completedCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the target completed %d keys, want at least %d", tg.completedCount(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check asserts that the target saw every stored event's key and completed
// it once, and completed nothing else.
func (tg *dedupTarget) check(t *testing.T, devices, webhooks map[string]bool) {
	t.Helper()
	tg.mu.Lock()
	defer tg.mu.Unlock()
	want := map[string]bool{}
	for k := range devices {
		want[k] = true
	}
	for k := range webhooks {
		want[k] = true
	}
	effects := map[string]int{}
	rows, err := tg.pool.Query(context.Background(), `SELECT key, count(*) FROM target_effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		effects[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	redelivered := 0
	for k := range want {
		if tg.seen[k] == 0 {
			t.Errorf("%s: stored, never delivered to the target", k)
		}
		if effects[k] != 1 {
			t.Errorf("%s: completed %d times by the target, want 1", k, effects[k])
		}
		if tg.seen[k] > 1 {
			redelivered++
		}
	}
	for k := range tg.seen {
		if !want[k] {
			t.Errorf("%s: delivered to the target, not in a stream", k)
		}
	}
	for k := range effects {
		if !want[k] {
			t.Errorf("%s: completed by the target, not in a stream", k)
		}
	}
	var keys int
	if err := tg.pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox WHERE handler_name = 'cluster-target'`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != len(want) {
		t.Errorf("dedup inbox holds %d keys, want %d", keys, len(want))
	}
	t.Logf("target: %d keys completed once each; %d delivered more than once; %d retried attempts; %d dedup errors", len(want), redelivered, tg.retries, tg.failures)
}

// pacedProducer posts small batches of events to an agent's intake at a
// steady pace until stopped, and records the ids the agent accepted.
type pacedProducer struct {
	url, device string
	mu          sync.Mutex
	accepted    []string
	next        int
}

func (pr *pacedProducer) run(ctx context.Context) {
	client := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		var batch []map[string]any
		var ids []string
		for range 5 {
			id := fmt.Sprintf("evt_%s_%06d", pr.device, pr.next)
			pr.next++
			ids = append(ids, id)
			batch = append(batch, map[string]any{"event_id": id, "type": "cluster.test", "payload": map[string]any{"n": pr.next}})
		}
		body, _ := json.Marshal(batch)
		if resp, err := client.Post(pr.url+"/v1/events", "application/json", bytes.NewReader(body)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusAccepted {
				pr.mu.Lock()
				pr.accepted = append(pr.accepted, ids...)
				pr.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// webhookSenders post webhooks to the nodes of a cluster: to a random
// node, to two nodes at once, or to one node and then another under the
// same key. A key is acked when any node answered 2xx.
type webhookSenders struct {
	nodes []*clusterNode
	mu    sync.Mutex
	acked map[string]bool
	codes map[int]int // answers, by status (0: no answer)
}

func (ws *webhookSenders) run(ctx context.Context, t *testing.T, w int) {
	hc := &http.Client{Timeout: 5 * time.Second}
	post := func(node *clusterNode, key, body string) int {
		req, _ := http.NewRequestWithContext(ctx, "POST", node.url+"/webhooks", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusConflict {
			t.Errorf("webhook %s sent again with the same body to %s: 409", key, node.name)
		}
		return resp.StatusCode
	}
	for n := 0; ctx.Err() == nil; n++ {
		key := fmt.Sprintf("wh-%d-%06d", w, n)
		body := fmt.Sprintf(`{"sender":%d,"n":%d}`, w, n)
		i := rand.IntN(len(ws.nodes))
		a, b := ws.nodes[i], ws.nodes[(i+1+rand.IntN(len(ws.nodes)-1))%len(ws.nodes)]
		var codes []int
		switch n % 3 {
		case 0:
			codes = append(codes, post(a, key, body))
		case 1: // two nodes at once
			var mu sync.Mutex
			var g sync.WaitGroup
			for _, node := range []*clusterNode{a, b} {
				g.Go(func() {
					c := post(node, key, body)
					mu.Lock()
					codes = append(codes, c)
					mu.Unlock()
				})
			}
			g.Wait()
		case 2: // one, then another
			codes = append(codes, post(a, key, body), post(b, key, body))
		}
		ws.mu.Lock()
		if ws.codes == nil {
			ws.codes = map[int]int{}
		}
		for _, c := range codes {
			ws.codes[c]++
		}
		ws.mu.Unlock()
		if slices.ContainsFunc(codes, func(c int) bool { return c == http.StatusAccepted || c == http.StatusOK }) {
			ws.mu.Lock()
			if ws.acked == nil {
				ws.acked = map[string]bool{}
			}
			ws.acked[key] = true
			ws.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (ws *webhookSenders) ackedCount() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return len(ws.acked)
}

func (ws *webhookSenders) waitAcked(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for ws.ackedCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d webhooks acked, want at least %d%s", ws.ackedCount(), n, nodeLogs(ws.nodes))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// auditClusterStreams reads the streams devices and webhooks from the
// earliest event through the stream backend, asserts that each accepted
// event and acked webhook is stored once, and returns the Idempotency-Keys
// the workers send for the stored events of each.
func auditClusterStreams(t *testing.T, streams string, producers []*pacedProducer, ws *webhookSenders) (devices, webhooks map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := streamnats.ParseURL(streams)
	if err != nil {
		t.Fatal(err)
	}
	b, err := streamnats.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	read := func(streamID string) map[string]int {
		id := fmt.Sprintf("cluster-audit-%s-%d", streamID, time.Now().UnixNano())
		if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: id, StreamID: streamID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
			t.Fatal(err)
		}
		defer b.DeleteConsumer(context.Background(), id)
		stored := map[string]int{}
		var n, last int64
		for from := int64(1); ; {
			batch, err := b.Read(ctx, id, from, 500)
			if err != nil {
				t.Fatalf("read stream %s at %d: %v", streamID, from, err)
			}
			for _, e := range batch.Events {
				n++
				if e.Offset != n {
					t.Errorf("stream %s: event %d at offset %d, want dense offsets from 1", streamID, n, e.Offset)
				}
				key := e.NativeID
				if e.Variant != "" {
					key = url.PathEscape(e.Variant) + "/" + e.NativeID
				}
				stored[key]++
				last = e.Offset
			}
			if len(batch.Events) == 0 || last >= batch.HighWatermark {
				break
			}
			from = last + 1
		}
		return stored
	}
	devStored, whStored := read("devices"), read("webhooks")
	accepted := 0
	for _, pr := range producers {
		pr.mu.Lock()
		for _, id := range pr.accepted {
			accepted++
			if k := pr.device + "/" + id; devStored[k] != 1 {
				t.Errorf("%s: accepted by its agent, stored %d times", k, devStored[k])
			}
		}
		pr.mu.Unlock()
	}
	ws.mu.Lock()
	for k := range ws.acked {
		if whStored[k] != 1 {
			t.Errorf("webhook %s: answered 2xx, stored %d times", k, whStored[k])
		}
	}
	ws.mu.Unlock()
	devices, webhooks = map[string]bool{}, map[string]bool{}
	for k, n := range devStored {
		if n != 1 {
			t.Errorf("device event %s stored %d times", k, n)
		}
		devices[k] = true
	}
	for k, n := range whStored {
		if n != 1 {
			t.Errorf("webhook %s stored %d times", k, n)
		}
		webhooks[k] = true
	}
	ws.mu.Lock()
	t.Logf("%d events accepted by agents, %d stored; %d webhooks acked, %d stored; webhook answers by status: %v", accepted, len(devices), len(ws.acked), len(webhooks), ws.codes)
	ws.mu.Unlock()
	if accepted == 0 || ws.ackedCount() == 0 {
		t.Fatal("no event or no webhook was accepted: the test proved nothing")
	}
	return devices, webhooks
}

type inboxCounts struct {
	Inbox                                  string
	Pending, Processing, Completed, Failed int
}

// waitInboxesDone waits until each inbox of want has its number of items
// completed and none pending, processing or failed, asking a live node.
// An item still processing well after its lease ended fails the test.
func waitInboxesDone(t *testing.T, nodes []*clusterNode, want map[string]int) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	var last []inboxCounts
	for {
		var node *clusterNode
		for _, n := range nodes {
			if !n.down {
				node = n
				break
			}
		}
		var body struct{ Inboxes []inboxCounts }
		if resp, err := hc.Get(node.url + "/v1/inboxes"); err == nil {
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
		}
		last = body.Inboxes
		done := 0
		for _, in := range body.Inboxes {
			n, ok := want[in.Inbox]
			if !ok {
				continue
			}
			if in.Pending == 0 && in.Processing == 0 && in.Failed == 0 && in.Completed == n {
				done++
			}
			if in.Failed > 0 {
				t.Fatalf("inbox %s: %d items failed: %+v", in.Inbox, in.Failed, body.Inboxes)
			}
			if in.Processing > 0 {
				checkLeases(t, hc, node, in.Inbox)
			}
		}
		if done == len(want) {
			t.Logf("inboxes: %+v", body.Inboxes)
			return
		}
		if time.Now().After(deadline) {
			var consumers string
			if resp, err := hc.Get(node.url + "/v1/consumers"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				consumers = string(b)
			}
			t.Fatalf("inboxes %+v, want %v completed and nothing else; consumers: %s%s", last, want, consumers, nodeLogs(nodes))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkLeases fails the test if an item of inbox is processing although
// its lease ended more than a grace period ago: nobody returned it to
// pending.
func checkLeases(t *testing.T, hc *http.Client, node *clusterNode, inbox string) {
	t.Helper()
	resp, err := hc.Get(node.url + "/v1/inboxes/" + inbox + "/items?state=processing&limit=1000")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var body struct {
		Items []struct {
			ID             int64      `json:"id"`
			EventID        string     `json:"event_id"`
			Attempts       int        `json:"attempts"`
			LeaseExpiresAt *time.Time `json:"lease_expires_at"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return
	}
	const grace = 15 * time.Second
	for _, it := range body.Items {
		if it.LeaseExpiresAt != nil && time.Since(*it.LeaseExpiresAt) > grace {
			t.Fatalf("inbox %s: item %d (%s, attempt %d) still processing %v after its lease ended at %v",
				inbox, it.ID, it.EventID, it.Attempts, time.Since(*it.LeaseExpiresAt).Round(time.Second), it.LeaseExpiresAt)
		}
	}
}

// logLines returns the lines of a node's log that contain s.
func logLines(n *clusterNode, s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(n.log.String()))
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			out = append(out, sc.Text())
		}
	}
	return out
}
