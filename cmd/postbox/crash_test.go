package main_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// binary is the postbox binary the crash tests run, built by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "postbox-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "postbox")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build postbox: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a postbox subprocess.
type proc struct {
	t    *testing.T
	bin  string // the binary it runs; binary when empty
	args []string
	cmd  *exec.Cmd
	log  *bytes.Buffer
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, args: args}
	p.restart()
	t.Cleanup(func() { p.kill() })
	return p
}

func (p *proc) restart() {
	p.t.Helper()
	p.log = &bytes.Buffer{}
	p.cmd = exec.Command(cmp.Or(p.bin, binary), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
		p.cmd = nil
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, url string, p *proc) {
	t.Helper()
	// A minute: under the race detector on a loaded machine a server on
	// an in-process Kafka took over 20 s to be ready.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.kill() // its log is whole, and no longer written, once it is reaped
	t.Fatalf("%s did not come up; its log:\n%s", url, p.log)
}

// producer posts events to an agent's intake until stopped and records
// the ids the agent accepted (202).
type producer struct {
	url      string
	device   string
	mu       sync.Mutex
	accepted []string
	next     int
}

func (pr *producer) run(ctx context.Context) {
	client := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		var batch []map[string]any
		ids := make([]string, 0, 20)
		for range 20 {
			id := fmt.Sprintf("evt_%s_%06d", pr.device, pr.next)
			pr.next++
			ids = append(ids, id)
			batch = append(batch, map[string]any{"event_id": id, "type": "crash.test", "payload": map[string]any{"n": pr.next, "pad": "abcdefghijklmnopqrstuvwxyz"}})
		}
		body, _ := json.Marshal(batch)
		resp, err := client.Post(pr.url+"/v1/events", "application/json", bytes.NewReader(body))
		if err != nil {
			time.Sleep(10 * time.Millisecond) // the agent is down: try again (new ids)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusAccepted {
			pr.mu.Lock()
			pr.accepted = append(pr.accepted, ids...)
			pr.mu.Unlock()
		}
	}
}

type outboxCounts struct{ Pending, Rejected int64 }

func agentCounts(url string) (outboxCounts, error) {
	resp, err := http.Get(url + "/v1/outbox")
	if err != nil {
		return outboxCounts{}, err
	}
	defer resp.Body.Close()
	var c outboxCounts
	return c, json.NewDecoder(resp.Body).Decode(&c)
}

// drained waits until every agent's outbox is empty.
func drained(t *testing.T, agents map[string]*proc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for url, p := range agents {
		for {
			c, err := agentCounts(url)
			if err == nil && c.Pending == 0 && c.Rejected == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %s outbox not drained (%+v, %v); its log:\n%s", url, c, err, p.log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// checkStored asserts that the store holds every accepted id exactly once
// and nothing else from these devices.
func checkStored(t *testing.T, dbPath string, producers []*producer) {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	total := 0
	for _, pr := range producers {
		total += len(pr.accepted)
		stored := map[string]int{}
		rows, err := db.Query(`SELECT source_native_id FROM stream_events WHERE stream_id = 'devices' AND source_native_id >= ? AND source_native_id < ?`,
			"evt_"+pr.device+"_", "evt_"+pr.device+"_~")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			rows.Scan(&id)
			stored[id]++
		}
		rows.Close()
		for _, id := range pr.accepted {
			if stored[id] != 1 {
				t.Errorf("%s: accepted by the agent, stored %d times", id, stored[id])
			}
		}
		for id, n := range stored {
			if n != 1 {
				t.Errorf("%s stored %d times", id, n)
			}
		}
	}
	var rows, dups int
	if err := db.QueryRow(`SELECT count(*), sum(attempt_count) - count(*) FROM stream_events`).Scan(&rows, &dups); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events accepted by agents, %d stored, %d redeliveries acknowledged as duplicates", total, rows, dups)
	if total == 0 {
		t.Fatal("no event was accepted: the test proved nothing")
	}
}

func startAgents(t *testing.T, dir, server string, n int) (map[string]*proc, []*producer) {
	agents := map[string]*proc{}
	var producers []*producer
	for i := range n {
		device := "pi-" + strconv.Itoa(i)
		listen := freePort(t)
		a := start(t, "agent", "--server", server, "--outbox", filepath.Join(dir, device+".db"), "--device-id", device,
			"--listen", listen, "--backoff-max", "200ms", "--log-level", "warn")
		url := "http://" + listen
		waitHTTP(t, url+"/health", a)
		agents[url] = a
		producers = append(producers, &producer{url: url, device: device})
	}
	return agents, producers
}

// crashRun starts a server and agents, feeds the agents events, and calls
// crash five times at random moments while events flow. At the end every
// event an agent accepted must be stored exactly once and every outbox
// must be empty.
func crashRun(t *testing.T, agentCount int, crash func(srv *proc, srvURL string, agents map[string]*proc)) {
	crashRunWith(t, agentCount, nil, crash, nil)
}

// crashRunWith is crashRun that calls ready once the server is up and
// check with the server's URL before it is stopped at the end.
func crashRunWith(t *testing.T, agentCount int, ready func(srvURL string), crash func(srv *proc, srvURL string, agents map[string]*proc), check func(srvURL, dbPath string)) {
	crashRunOn(t, agentCount, nil, ready, crash, check, checkStored)
}

// crashRunOn is crashRunWith for postbox serve with serveArgs added to its
// flags, and stored in place of checkStored: it is called once the server
// is stopped, with the producers whose accepted events it must find
// stored exactly once.
func crashRunOn(t *testing.T, agentCount int, serveArgs []string, ready func(srvURL string), crash func(srv *proc, srvURL string, agents map[string]*proc),
	check func(srvURL, dbPath string), stored func(t *testing.T, dbPath string, producers []*producer)) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	dir := t.TempDir()
	addr := freePort(t)
	dbPath := filepath.Join(dir, "postbox.db")
	srv := start(t, append([]string{"serve", "--addr", addr, "--db", dbPath, "--log-level", "warn"}, serveArgs...)...)
	waitHTTP(t, "http://"+addr+"/ready", srv)
	if ready != nil {
		ready("http://" + addr)
	}
	agentURL := "ws://" + addr // agents speak gRPC to a server with --grpc-addr
	if i := slices.Index(serveArgs, "--grpc-addr"); i >= 0 {
		agentURL = "grpc://" + serveArgs[i+1]
	}
	agents, producers := startAgents(t, dir, agentURL, agentCount)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, pr := range producers {
		wg.Go(func() { pr.run(ctx) })
	}
	for range 5 {
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond) // a random moment
		crash(srv, "http://"+addr, agents)
	}
	time.Sleep(200 * time.Millisecond) // let events flow after the last crash
	stop()
	wg.Wait()
	drained(t, agents)
	if check != nil {
		check("http://"+addr, dbPath)
	}
	srv.kill()
	stored(t, dbPath, producers)
}

// TestCrashServer kills the control plane with SIGKILL at random moments
// while agents stream events, restarts it, and counts every event.
func TestCrashServer(t *testing.T) {
	crashRun(t, 3, func(srv *proc, srvURL string, _ map[string]*proc) {
		srv.kill()
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
		srv.restart()
		waitHTTP(t, srvURL+"/ready", srv)
	})
}

// TestCrashAgent kills the agents with SIGKILL at random moments while a
// program feeds them events, restarts them, and counts every event they
// accepted.
func TestCrashAgent(t *testing.T) {
	crashRun(t, 2, func(_ *proc, _ string, agents map[string]*proc) {
		for url, a := range agents {
			a.kill()
			a.restart()
			waitHTTP(t, url+"/health", a)
		}
	})
}

// TestCrashDuringConsumption kills the control plane with SIGKILL at
// random moments while two subscriptions materialise inbox items and a
// runtime leases and acks them. At the end every event has exactly one
// item per subscription whose rules it matches, and no other item exists.
func TestCrashDuringConsumption(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var runtime sync.WaitGroup
	defer runtime.Wait()
	defer stop()
	crashRunWith(t, 2,
		func(srvURL string) {
			for _, body := range []string{
				`{"name":"everything","source":"devices","start":"earliest"}`,
				`{"name":"pi-0-only","source":"devices","metadata":{"device_id":"pi-0"},"start":"earliest"}`,
			} {
				resp, err := http.Post(srvURL+"/v1/subscriptions", "application/json", bytes.NewBufferString(body))
				if err != nil || resp.StatusCode != http.StatusCreated {
					t.Fatalf("create subscription %s: %v %v", body, resp, err)
				}
				resp.Body.Close()
			}
			runtime.Go(func() { leaseAndAck(ctx, srvURL, "everything") })
		},
		func(srv *proc, srvURL string, _ map[string]*proc) {
			srv.kill()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		func(srvURL, dbPath string) {
			deadline := time.Now().Add(60 * time.Second)
			for !caughtUp(srvURL) {
				if time.Now().After(deadline) {
					t.Fatal("subscriptions did not catch up with their stream")
				}
				time.Sleep(50 * time.Millisecond)
			}
			stop()
			runtime.Wait()
			db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			type event struct {
				id     string
				device string
			}
			events := map[int64]event{}
			rows, err := db.Query(`SELECT "offset", source_native_id, json_extract(metadata_json, '$.device_id') FROM stream_events WHERE stream_id = 'devices'`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var off int64
				var e event
				rows.Scan(&off, &e.id, &e.device)
				events[off] = e
			}
			rows.Close()
			for sub, match := range map[string]func(event) bool{
				"everything": func(event) bool { return true },
				"pi-0-only":  func(e event) bool { return e.device == "pi-0" },
			} {
				items := map[int64]int{}
				completed := 0
				rows, err := db.Query(`SELECT "offset", source_native_id, state FROM inbox_items WHERE subscription_id = ?`, sub)
				if err != nil {
					t.Fatal(err)
				}
				for rows.Next() {
					var off int64
					var id, state string
					rows.Scan(&off, &id, &state)
					items[off]++
					if e, ok := events[off]; !ok || e.id != id || !match(e) {
						t.Errorf("%s: item for offset %d (%s) matches no event", sub, off, id)
					}
					if state == "completed" {
						completed++
					}
				}
				rows.Close()
				matching := 0
				for off, e := range events {
					if !match(e) {
						continue
					}
					matching++
					if items[off] != 1 {
						t.Errorf("%s: event %d (%s) has %d items, want 1", sub, off, e.id, items[off])
					}
				}
				t.Logf("%s: %d matching events, %d items (%d completed by the runtime)", sub, matching, len(items), completed)
				if matching == 0 {
					t.Errorf("%s: no event matched: the test proved nothing", sub)
				}
			}
		})
}

// caughtUp reports whether every consumer of the server has lag 0.
func caughtUp(srvURL string) bool {
	resp, err := http.Get(srvURL + "/v1/consumers")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Consumers []struct{ Lag int64 } `json:"consumers"`
	}
	if json.NewDecoder(resp.Body).Decode(&body) != nil || len(body.Consumers) == 0 {
		return false
	}
	for _, c := range body.Consumers {
		if c.Lag != 0 {
			return false
		}
	}
	return true
}

// leaseAndAck is a runtime: it leases items of inbox and acks them until
// ctx ends, riding out the server's crashes.
func leaseAndAck(ctx context.Context, srvURL, inbox string) {
	hc := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		resp, err := hc.Post(srvURL+"/v1/inboxes/"+inbox+"/lease", "application/json", bytes.NewBufferString(`{"max":200,"visibility_timeout":"2s","wait":"200ms"}`))
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		var lease struct {
			Lease string
			Items []struct{ ID int64 }
		}
		json.NewDecoder(resp.Body).Decode(&lease)
		resp.Body.Close()
		if len(lease.Items) == 0 {
			continue
		}
		ids := make([]int64, len(lease.Items))
		for i, it := range lease.Items {
			ids[i] = it.ID
		}
		body, _ := json.Marshal(map[string]any{"ids": ids, "lease": lease.Lease})
		if resp, err := hc.Post(srvURL+"/v1/inboxes/"+inbox+"/ack", "application/json", bytes.NewReader(body)); err == nil {
			resp.Body.Close()
		}
	}
}

// TestCrashWebhooks kills postbox serve with SIGKILL while webhooks are
// posted: every webhook answered 202 or 200 is stored exactly once after
// the restart, and sending each again answers 200, never 202 or 409.
func TestCrashWebhooks(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	dir := t.TempDir()
	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn")
	base := "http://" + addr
	waitHTTP(t, base+"/ready", srv)
	ctx, stop := context.WithCancel(context.Background())
	wp := &webhookPoster{base: base}
	done := make(chan struct{})
	go func() { defer close(done); wp.run(ctx) }()
	for range 3 {
		time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond) // a random moment
		srv.kill()
		srv.restart()
		waitHTTP(t, base+"/ready", srv)
	}
	stop()
	<-done
	t.Logf("%d webhooks accepted across 3 SIGKILLs, each stored once", wp.check(t))

	// The kept counts survived the crashes with the items: once the
	// default subscription has read every webhook, it counts one pending
	// item for each (nothing delivers them).
	var sub struct {
		HighWatermark int64 `json:"high_watermark"`
		Lag           int64 `json:"lag"`
		Counts        struct {
			Pending, Processing, Completed, Failed int64
		} `json:"counts"`
	}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(base + "/v1/subscriptions/webhooks")
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&sub)
		resp.Body.Close()
		if err == nil && sub.Lag == 0 && sub.HighWatermark > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the default subscription did not read every webhook: %+v, %v", sub, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c := sub.Counts; c.Pending != sub.HighWatermark || c.Processing+c.Completed+c.Failed != 0 {
		t.Fatalf("after the crashes the webhooks subscription counts %+v for %d stored webhooks", c, sub.HighWatermark)
	}
}

// webhookPoster posts webhooks to the server at base, four at a time,
// each with an Idempotency-Key of its own, and records those answered 202
// or 200.
type webhookPoster struct {
	base  string
	mu    sync.Mutex
	acked map[int]bool
}

func (wp *webhookPoster) post(hc *http.Client, n int) int {
	req, _ := http.NewRequest("POST", wp.base+"/webhooks", bytes.NewBufferString(fmt.Sprintf(`{"n":%d}`, n)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", fmt.Sprint("wh-", n))
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// run posts until ctx ends.
func (wp *webhookPoster) run(ctx context.Context) {
	wp.mu.Lock() // a test may read acked while run runs
	wp.acked = map[int]bool{}
	wp.mu.Unlock()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			hc := &http.Client{Timeout: 5 * time.Second}
			for n := w; ctx.Err() == nil; n += 4 {
				if s := wp.post(hc, n); s == http.StatusAccepted || s == http.StatusOK {
					wp.mu.Lock()
					wp.acked[n] = true
					wp.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

// check sends every accepted webhook again, once run returned: each must
// answer 200 (stored), never 202 or 409. It returns how many there were.
func (wp *webhookPoster) check(t *testing.T) int {
	t.Helper()
	if len(wp.acked) == 0 {
		t.Fatal("no webhook was accepted: the test proved nothing")
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	for n := range wp.acked {
		if s := wp.post(hc, n); s != http.StatusOK {
			t.Fatalf("webhook %d was accepted before a crash; sent again it answers %d, want 200 (stored)", n, s)
		}
	}
	return len(wp.acked)
}

// TestCrashMidProcessing kills postbox serve with SIGKILL while its
// workers are inside a target's handler: after the restart every
// interrupted item is retried, with the attempt it was on still counted,
// and every webhook is completed exactly once.
func TestCrashMidProcessing(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	var mu sync.Mutex
	blocking := true
	inFlight := 0
	completed := map[string]int{} // answered 200, by idempotency key
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then the server watches the connection, and r's context ends when it drops
		mu.Lock()
		block := blocking
		if block {
			inFlight++
		}
		mu.Unlock()
		if block {
			<-r.Context().Done() // the server died holding this request
			return
		}
		mu.Lock()
		completed[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
	}))
	defer target.Close()
	dir := t.TempDir()
	addr := freePort(t)
	base := "http://" + addr
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn",
		"--webhook-target", target.URL, "--workers", "8", "--retry-base-delay", "50ms")
	waitHTTP(t, base+"/ready", srv)
	const n = 20
	for i := range n {
		req, _ := http.NewRequest("POST", base+"/webhooks", bytes.NewBufferString(fmt.Sprintf(`{"n":%d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint("k-", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %d: %v %v", i, resp, err)
		}
		resp.Body.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		busy := inFlight
		mu.Unlock()
		if busy == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests reached the target, want 8 (one per worker); log:\n%s", busy, srv.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.kill() // mid-processing
	// 8 items are inside the target, and the dispatcher may have leased a
	// few more for the workers (an attempt counts from the lease): the
	// database says how many were processing at the kill. (Waiting for
	// /v1/inboxes to hold still for 300ms missed a lease made later on a
	// loaded machine.)
	leased := countProcessing(t, filepath.Join(dir, "postbox.db"))
	if leased < 8 {
		t.Fatalf("%d items processing, want at least the 8 inside the target", leased)
	}
	mu.Lock()
	blocking = false
	mu.Unlock()
	srv.restart()
	waitHTTP(t, base+"/ready", srv)
	for deadline = time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var body struct {
			Inboxes []struct {
				Completed int `json:"completed"`
			} `json:"inboxes"`
		}
		if resp, err := http.Get(base + "/v1/inboxes"); err == nil {
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
		}
		if len(body.Inboxes) == 1 && body.Inboxes[0].Completed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inboxes %+v, want %d completed; log:\n%s", body.Inboxes, n, srv.log)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if c := completed[fmt.Sprint("k-", i)]; c != 1 {
			t.Errorf("webhook k-%d was completed by the target %d times, want 1", i, c)
		}
	}
	retried := 0
	for i := range n {
		// Completed: the error of the first attempt is history, on its
		// delivery's item.
		var wh struct {
			Attempts   int `json:"attempts"`
			Deliveries []struct {
				Item *struct {
					LastError *string `json:"last_error"`
				} `json:"item"`
			} `json:"deliveries"`
		}
		resp, err := http.Get(base + "/webhooks?idempotency_key=k-" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&wh)
		resp.Body.Close()
		if wh.Attempts == 2 && len(wh.Deliveries) == 1 && wh.Deliveries[0].Item != nil && wh.Deliveries[0].Item.LastError != nil {
			retried++
		}
	}
	if retried != leased {
		t.Fatalf("%d webhooks have 2 attempts and an error, want the %d that were processing at the kill", retried, leased)
	}
}

// countProcessing returns how many inbox items the database at dbPath
// holds in processing.
func countProcessing(t *testing.T, dbPath string) int {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM inbox_items WHERE state = 'processing'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
