package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox/outboxkafka"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
)

// The tests of postbox relay and postbox outbox emit|migrate|list|requeue
// on a transactional outbox. Each runs the real binary against the
// PostgreSQL, Redis and NATS that internal/testenv finds, in a schema,
// stream or JetStream stream of its own.

// runScrubbed is run without the environment variables that stand in
// for relay and outbox flags, so that a developer's DATABASE_URL cannot
// change what a test of missing flags sees. A command still running after
// a minute (a relay that was expected to refuse to start) is killed.
func runScrubbed(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return runWithEnv(t, nil, args...)
}

// runWithEnv is runScrubbed with the variables env (NAME=value) set.
func runWithEnv(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "POSTBOX_RELAY_TO", "POSTBOX_RELAY_LISTEN", "POSTBOX_OUTBOX", "POSTBOX_TOKEN":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("postbox %q was still running after %s: %s", args, time.Minute, out)
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatal(err)
	return "", -1
}

// emit runs postbox outbox emit and fails the test unless it inserted.
func emit(t *testing.T, args ...string) string {
	t.Helper()
	out, code := runScrubbed(t, append([]string{"outbox", "emit"}, args...)...)
	if code != 0 || !strings.Contains(out, "inserted") {
		t.Fatalf("postbox outbox emit %s: exit %d, %s", strings.Join(args, " "), code, out)
	}
	return out
}

// outboxPool opens the transactional outbox at dsn for the test's own
// checks; it is closed when the test ends.
func outboxPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// outboxEventIDs returns the event ids in the outbox, in seq order.
func outboxEventIDs(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id FROM outbox ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// outboxStates counts the outbox's rows by state.
type outboxStates struct{ pending, delivered, rejected, claimed int64 }

func countStates(pool *pgxpool.Pool) (outboxStates, error) {
	var s outboxStates
	err := pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE delivered_at IS NULL AND rejected_at IS NULL),
		count(*) FILTER (WHERE delivered_at IS NOT NULL),
		count(*) FILTER (WHERE rejected_at IS NOT NULL),
		count(*) FILTER (WHERE delivered_at IS NULL AND rejected_at IS NULL AND next_attempt_at > now())
		FROM outbox`).Scan(&s.pending, &s.delivered, &s.rejected, &s.claimed)
	return s, err
}

// waitUntil polls cond every few milliseconds until it holds, and fails
// the test with what (and the logs of procs, which it kills) at the
// deadline.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool, procs ...*proc) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for i, p := range procs {
				fmt.Fprintf(&logs, "\n--- log of process %d (postbox %s):\n%s", i, strings.Join(p.args, " "), procLog(p))
			}
			t.Fatalf("after %s: %s%s", timeout, what, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procLog kills p and returns its output. The buffer is written by the
// process's copying goroutine until the process is reaped, so it is read
// only after that.
func procLog(p *proc) string {
	p.kill()
	return p.log.String()
}

// stopRelay stops p with SIGTERM, as an operator or an orchestrator
// would, fails the test unless it exits 0 within 20s, and returns its
// output.
func stopRelay(t *testing.T, p *proc) string {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		p.cmd = nil
		if err != nil {
			t.Errorf("postbox %s after SIGTERM: %v, want exit 0; log:\n%s", strings.Join(p.args, " "), err, p.log)
		}
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-done
		p.cmd = nil
		t.Fatalf("postbox %s did not stop within 20s of SIGTERM; log:\n%s", strings.Join(p.args, " "), p.log)
	}
	return p.log.String()
}

var stoppedLine = regexp.MustCompile(`msg="relay: stopped" delivered=(\d+)`)

// stoppedDelivered reads the delivered count of a relay's last
// "relay: stopped" line, or -1.
func stoppedDelivered(log string) int64 {
	m := stoppedLine.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return n
}

// scrape reads a relay's /metrics as series ("name{labels}") to value.
func scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// The series postbox relay exports.
const (
	mDelivered   = `postbox_relay_events_total{result="delivered"}`
	mRejected    = `postbox_relay_events_total{result="rejected"}`
	mUnanswered  = `postbox_relay_events_total{result="unanswered"}`
	mFailures    = `postbox_relay_publish_failures_total`
	mPending     = `postbox_outbox_events{state="pending"}`
	mRejectedNow = `postbox_outbox_events{state="rejected"}`
	mOldestAge   = `postbox_outbox_oldest_pending_age_seconds`
)

// redisStream returns a client of the test Redis and a stream name of the
// test's own, deleted when the test ends.
func redisStream(t *testing.T) (rc *redis.Client, url, stream string) {
	t.Helper()
	base := testenv.URL(t, testenv.Redis)
	opts, err := redis.ParseURL(base)
	if err != nil {
		t.Fatal(err)
	}
	rc = redis.NewClient(opts)
	stream = fmt.Sprintf("postbox_test_%s_%d", t.Name(), time.Now().UnixNano())
	t.Cleanup(func() {
		rc.Del(context.Background(), stream)
		rc.Close()
	})
	return rc, base + "?stream=" + stream, stream
}

// streamEventIDs reads the whole stream, in pages, and counts its entries
// by event_id.
func streamEventIDs(t *testing.T, rc *redis.Client, stream string) (seen map[string]int, entries int) {
	t.Helper()
	ctx := context.Background()
	seen = map[string]int{}
	for start := "-"; ; {
		page, err := rc.XRangeN(ctx, stream, start, "+", 10000).Result()
		if err != nil {
			t.Fatalf("XRANGE %s: %v", stream, err)
		}
		for _, e := range page {
			id, _ := e.Values["event_id"].(string)
			if id == "" {
				t.Fatalf("stream entry %s has no event_id: %v", e.ID, e.Values)
			}
			seen[id]++
		}
		entries += len(page)
		if len(page) < 10000 {
			return seen, entries
		}
		start = "(" + page[len(page)-1].ID
	}
}

// checkStream checks that the stream holds every id of the outbox and
// nothing else, and returns how many entries are duplicates (the same
// event appended more than once).
func checkStream(t *testing.T, rc *redis.Client, stream string, ids []string) (duplicates int) {
	t.Helper()
	seen, entries := streamEventIDs(t, rc, stream)
	missing := 0
	inOutbox := make(map[string]bool, len(ids))
	for _, id := range ids {
		inOutbox[id] = true
		if seen[id] == 0 {
			if missing < 10 {
				t.Errorf("event %s is in the outbox, not in the stream", id)
			}
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d events missing from the stream", missing, len(ids))
	}
	for id := range seen {
		if !inOutbox[id] {
			t.Errorf("the stream holds %s, which is not in the outbox", id)
		}
	}
	return entries - len(seen)
}

// TestRelayThreeInParallel: three postbox relay processes share one
// outbox of 100,000 events; every event reaches the Redis stream, none
// twice (the relays' claims, 10s, are extended while they work, however
// loaded the machine), and each relay did part of the work.
func TestRelayThreeInParallel(t *testing.T) {
	if testing.Short() {
		t.Skip("relays 100,000 events through the real binary")
	}
	const events = 100000
	dsn := testenv.PostgresSchema(t)
	rc, to, stream := redisStream(t)
	pool := outboxPool(t, dsn)

	began := time.Now()
	out := emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":42,"pad":"abcdefghijklmnopqrstuvwxyz"}`,
		"--count", strconv.Itoa(events), "--batch", "1000")
	if !strings.Contains(out, "inserted 100000 events") {
		t.Fatalf("emit: %s", out)
	}
	emitted := time.Since(began)
	ids := outboxEventIDs(t, pool)
	if len(ids) != events {
		t.Fatalf("the outbox holds %d rows after emit --count %d", len(ids), events)
	}

	began = time.Now()
	var relays []*proc
	var listens []string
	for range 3 {
		listen := freePort(t)
		listens = append(listens, listen)
		// A claim shorter than the run: rows waiting to be settled on a
		// loaded machine outlive it, and only the relays' heartbeat keeps
		// them from being sent again.
		relays = append(relays, start(t, "relay", "--db", dsn, "--to", to, "--listen", listen, "--progress", "1s", "--claim", "10s", "--ack-timeout", "5s"))
	}
	waitUntil(t, 3*time.Minute, "rows still undelivered", func() bool {
		s, err := countStates(pool)
		return err == nil && s.pending == 0
	}, relays...)
	relayed := time.Since(began)

	s, err := countStates(pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.delivered != events || s.rejected != 0 {
		t.Errorf("outbox: %+v, want all %d delivered", s, events)
	}
	// A relay counts a batch after its commit: the table may show every
	// row delivered a moment before the last batches reach the metrics.
	waitUntil(t, time.Minute, "the relays' metrics do not count every delivered event", func() bool {
		var sum float64
		for _, listen := range listens {
			m, err := scrape(listen)
			if err != nil {
				return false
			}
			sum += m[mDelivered]
		}
		return sum >= events
	}, relays...)
	var total float64
	for i, listen := range listens {
		m, err := scrape(listen)
		if err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
		t.Logf("relay %d: delivered %.0f, publish failures %.0f", i, m[mDelivered], m[mFailures])
		if m[mDelivered] == 0 {
			t.Errorf("relay %d delivered nothing: the three did not share the work", i)
		}
		if m[mFailures] != 0 || m[mUnanswered] != 0 || m[mRejected] != 0 {
			t.Errorf("relay %d: %.0f publish failures, %.0f unanswered, %.0f rejected, want none", i, m[mFailures], m[mUnanswered], m[mRejected])
		}
		if m[mPending] != 0 || m[mOldestAge] != 0 {
			t.Errorf("relay %d: pending gauge %.0f, oldest age %.1fs after all was delivered, want 0", i, m[mPending], m[mOldestAge])
		}
		total += m[mDelivered]
		if n := stoppedDelivered(stopRelay(t, relays[i])); float64(n) != m[mDelivered] {
			t.Errorf("relay %d logged delivered=%d when stopped, its metrics said %.0f", i, n, m[mDelivered])
		}
	}
	if total != events {
		t.Errorf("the relays delivered %.0f events between them, want %d", total, events)
	}

	began = time.Now()
	dups := checkStream(t, rc, stream, ids)
	t.Logf("%d events: emit %s, 3 relays %s (%.0f events/s), stream check %s; %d duplicates in the stream",
		events, emitted.Round(time.Millisecond), relayed.Round(time.Millisecond), events/relayed.Seconds(), time.Since(began).Round(time.Millisecond), dups)
	if dups != 0 {
		t.Errorf("%d events were appended more than once; with no relay dying, SKIP LOCKED and claims extended while the relays work should keep three relays apart", dups)
	}
}

// TestRelayKill9OneOfThree: of three relays sharing an outbox, one is
// killed with SIGKILL mid-way and not started again. Its heartbeat ends
// with it, so its claims run out and the two others send its rows: every
// event arrives, and none twice but those it had published and not yet
// marked delivered. (TestRelayThreeInParallel proves the other side: the
// claims of relays that are alive do not run out.)
func TestRelayKill9OneOfThree(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	const (
		events      = 30000
		maxInFlight = 400
	)
	dsn := testenv.PostgresSchema(t)
	rc, to, stream := redisStream(t)
	pool := outboxPool(t, dsn)
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":7}`, "--count", strconv.Itoa(events), "--batch", "1000")
	ids := outboxEventIDs(t, pool)
	if len(ids) != events {
		t.Fatalf("the outbox holds %d rows after emit --count %d", len(ids), events)
	}
	var relays []*proc
	for range 3 {
		relays = append(relays, start(t, "relay", "--db", dsn, "--to", to, "--listen", "", "--claim", "3s", "--ack-timeout", "1s",
			"--batch", "100", "--max-in-flight", strconv.Itoa(maxInFlight), "--poll", "200ms", "--log-level", "warn"))
	}
	ctx := context.Background()
	var xlen int64
	waitUntil(t, time.Minute, "XLEN did not reach a third of the events before the kill", func() bool {
		var err error
		xlen, err = rc.XLen(ctx, stream).Result()
		return err == nil && xlen >= events/3
	}, relays...)
	relays[0].kill()
	if xlen >= events*4/5 {
		t.Fatalf("XLEN was %d when the relay was killed, past 80%% of %d: not mid-way", xlen, events)
	}
	waitUntil(t, 2*time.Minute, "rows still undelivered after one relay of three was killed", func() bool {
		s, err := countStates(pool)
		return err == nil && s.pending == 0
	}, relays[1:]...)
	for _, r := range relays[1:] {
		stopRelay(t, r)
	}
	s, err := countStates(pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.delivered != events || s.rejected != 0 {
		t.Errorf("outbox after the kill: %d delivered, %d rejected, %d pending; want all %d delivered", s.delivered, s.rejected, s.pending, events)
	}
	dups := checkStream(t, rc, stream, ids)
	t.Logf("%d events, one relay of three killed at XLEN %d; %d appended twice", events, xlen, dups)
	// Published and not marked delivered: the window (MaxInFlight), and
	// as many answered rows whose outcome the store was recording.
	if dups > 2*maxInFlight {
		t.Errorf("%d duplicates, more than the %d events the killed relay could have published and not marked delivered", dups, 2*maxInFlight)
	}
}

// TestRelayKill9MidBatch kills a relay with SIGKILL three times while it
// has batches in flight, restarting it each time: no event is lost, the
// duplicates stay within what was in flight at the kills, and every row
// ends delivered.
func TestRelayKill9MidBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	const (
		events      = 30000
		maxInFlight = 400
		kills       = 3
	)
	dsn := testenv.PostgresSchema(t)
	rc, to, stream := redisStream(t)
	pool := outboxPool(t, dsn)
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":7}`, "--count", strconv.Itoa(events), "--batch", "1000")
	ids := outboxEventIDs(t, pool)
	if len(ids) != events {
		t.Fatalf("the outbox holds %d rows after emit --count %d", len(ids), events)
	}

	began := time.Now()
	relay := start(t, "relay", "--db", dsn, "--to", to, "--listen", "", "--claim", "3s", "--ack-timeout", "1s",
		"--batch", "100", "--max-in-flight", strconv.Itoa(maxInFlight), "--poll", "200ms", "--log-level", "warn")
	ctx := context.Background()
	var leftClaimed int64 // rows claimed by a relay when it was killed, summed over the kills
	for k := range kills {
		// Kill at 20%, 40% and 60% of the events appended, while batches
		// are in flight, and never past 80%, which would be no longer mid-way.
		at, limit := int64(events*(k+1)/5), int64(events*4/5)
		var n int64
		waitUntil(t, time.Minute, fmt.Sprintf("XLEN did not reach %d before kill %d", at, k+1), func() bool {
			var err error
			n, err = rc.XLen(ctx, stream).Result()
			return err == nil && n >= at
		}, relay)
		relay.kill()
		if n >= limit {
			t.Fatalf("kill %d: XLEN was %d when the relay was killed, past 80%% of %d; the relay went faster than the test polls", k+1, n, events)
		}
		s, err := countStates(pool)
		if err != nil {
			t.Fatal(err)
		}
		xlen, _ := rc.XLen(ctx, stream).Result()
		t.Logf("kill %d: XLEN %d, %d rows delivered, %d claimed by killed relays and not delivered", k+1, xlen, s.delivered, s.claimed)
		leftClaimed += s.claimed
		relay.restart()
	}
	if leftClaimed == 0 {
		t.Fatal("no kill left a claimed row behind: the relay was never killed with a batch in flight, and the test proved nothing")
	}
	waitUntil(t, 2*time.Minute, "rows still undelivered after the last restart", func() bool {
		s, err := countStates(pool)
		return err == nil && s.pending == 0
	}, relay)
	elapsed := time.Since(began)
	stopRelay(t, relay)

	s, err := countStates(pool)
	if err != nil {
		t.Fatal(err)
	}
	if s.delivered != events || s.rejected != 0 {
		t.Errorf("outbox after the kills: %d delivered, %d rejected (parked), %d pending; want all %d delivered", s.delivered, s.rejected, s.pending, events)
	}
	dups := checkStream(t, rc, stream, ids)
	t.Logf("%d events relayed across %d SIGKILLs in %s; %d appended twice (published, not yet marked delivered at a kill)",
		events, kills, elapsed.Round(time.Millisecond), dups)
	if dups > kills*maxInFlight {
		t.Errorf("%d duplicates, more than the %d events that can be in flight at %d kills", dups, kills*maxInFlight, kills)
	}
}

// listRows runs postbox outbox list --json with args.
func listRows(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	out, code := runScrubbed(t, append([]string{"outbox", "list", "--json"}, args...)...)
	var rows []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
		t.Fatalf("postbox outbox list --json %s: exit %d, %s", strings.Join(args, " "), code, out)
	}
	return rows
}

// TestRelayParksPoisonRow relays to a postbox server an outbox holding
// one event the server refuses for good (a payload that is not a JSON
// object): it ends rejected with the server's reason, the others are
// stored once, and postbox outbox requeue makes it pending again.
func TestRelayParksPoisonRow(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	pool := outboxPool(t, dsn)
	dir := t.TempDir()
	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)

	poison := fmt.Sprintf("evt_poison_%d", time.Now().UnixNano())
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":1}`, "--count", "5")
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `[1,2]`, "--id", poison)
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":2}`, "--count", "5", "--tenant", "acme")
	var good []string
	for _, id := range outboxEventIDs(t, pool) {
		if id != poison {
			good = append(good, id)
		}
	}

	listen := freePort(t)
	relay := start(t, "relay", "--db", dsn, "--to", "ws://"+addr, "--listen", listen, "--poll", "100ms", "--log-level", "warn")
	waitUntil(t, time.Minute, "rows still pending", func() bool {
		s, err := countStates(pool)
		return err == nil && s.pending == 0
	}, relay, srv)
	var m map[string]float64
	waitUntil(t, 30*time.Second, "the relay's metrics do not count every settled row", func() bool {
		m, _ = scrape(listen) // counted after the commit: a moment behind the table
		return m[mDelivered]+m[mRejected] >= 11
	}, relay, srv)
	if m[mDelivered] != 10 || m[mRejected] != 1 || m[mRejectedNow] != 1 || m[mPending] != 0 {
		t.Errorf("metrics: delivered %.0f, rejected %.0f, rejected gauge %.0f, pending %.0f; want 10, 1, 1, 0", m[mDelivered], m[mRejected], m[mRejectedNow], m[mPending])
	}
	log := stopRelay(t, relay)
	if !strings.Contains(log, poison) {
		t.Errorf("the relay's log does not name the rejected event %s:\n%s", poison, log)
	}

	rows := listRows(t, "--db", dsn)
	if len(rows) != 1 || rows[0]["event_id"] != poison || rows[0]["state"] != "rejected" || rows[0]["attempt_count"] != 1.0 ||
		!strings.Contains(fmt.Sprint(rows[0]["last_error"]), "payload: must be a JSON object") {
		t.Fatalf("outbox list (rejected): %v, want %s rejected at its first attempt with the server's reason", rows, poison)
	}
	if out, code := runScrubbed(t, "outbox", "list", "--db", dsn); code != 0 || !strings.Contains(out, "must be a JSON object") {
		t.Errorf("outbox list (table): exit %d, %s", code, out)
	}
	delivered := listRows(t, "--db", dsn, "--state", "delivered")
	var deliveredIDs []string
	for _, r := range delivered {
		deliveredIDs = append(deliveredIDs, fmt.Sprint(r["event_id"]))
		if r["delivered_at"] == nil {
			t.Errorf("delivered row without delivered_at: %v", r)
		}
	}
	if !slices.Equal(deliveredIDs, good) {
		t.Errorf("outbox list --state delivered: %v, want %v", deliveredIDs, good)
	}

	if out, code := runScrubbed(t, "outbox", "requeue", poison, "--db", dsn); code != 0 || !strings.Contains(out, "1 rejected events requeued") {
		t.Fatalf("outbox requeue: exit %d, %s", code, out)
	}
	pending := listRows(t, "--db", dsn, "--state", "pending")
	if len(pending) != 1 || pending[0]["event_id"] != poison || pending[0]["attempt_count"] != 0.0 {
		t.Fatalf("after requeue: pending rows %v, want %s with no attempts", pending, poison)
	}
	if rows := listRows(t, "--db", dsn); len(rows) != 0 {
		t.Errorf("after requeue: rejected rows %v, want none", rows)
	}
	if out, code := runScrubbed(t, "outbox", "requeue", poison, "--db", dsn); code != 1 || !strings.Contains(out, "none of") {
		t.Errorf("requeue of a pending row: exit %d, %s; want 1 and none of", code, out)
	}

	srv.kill()
	db, err := sqlitedb.Open(filepath.Join(dir, "postbox.db"), sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stored := map[string]int{}
	rs, err := db.Query(`SELECT source_native_id FROM stream_events WHERE stream_id = 'devices'`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id string
		rs.Scan(&id)
		stored[id]++
	}
	rs.Close()
	for _, id := range good {
		if stored[id] != 1 {
			t.Errorf("%s stored %d times by the server, want 1", id, stored[id])
		}
	}
	if len(stored) != len(good) {
		t.Errorf("the server stored %d events, want the %d good ones: %v", len(stored), len(good), stored)
	}
}

// TestRelayToJetStream relays a few events to NATS JetStream: the stream
// holds each once, with Nats-Msg-Id = event id; sent again (as after a
// relay that died before marking them), JetStream drops them as
// duplicates and the relay counts them delivered.
func TestRelayToJetStream(t *testing.T) {
	natsURL := testenv.URL(t, testenv.NATS)
	dsn := testenv.PostgresSchema(t)
	pool := outboxPool(t, dsn)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("POSTBOX_RELAYTEST_%d", time.Now().UnixNano())
	t.Cleanup(func() {
		if err := js.DeleteStream(context.Background(), name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})

	payload := `{"order":3,"lines":[{"sku":"a","qty":2}]}`
	emit(t, "--db", dsn, "--type", "order.created", "--payload", payload, "--count", "5", "--tenant", "acme")
	ids := outboxEventIDs(t, pool)

	listen := freePort(t)
	relay := start(t, "relay", "--db", dsn, "--to", natsURL+"?stream="+name, "--listen", listen, "--poll", "100ms", "--log-level", "warn")
	delivered := func(n float64) func() bool {
		return func() bool {
			m, err := scrape(listen)
			return err == nil && m[mDelivered] == n && m[mPending] == 0
		}
	}
	waitUntil(t, time.Minute, "the relay did not deliver 5 events", delivered(5), relay)

	check := func() {
		t.Helper()
		ctx := context.Background()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != uint64(len(ids)) {
			t.Fatalf("stream %s holds %d messages, want %d", name, info.State.Msgs, len(ids))
		}
		var want any
		json.Unmarshal([]byte(payload), &want)
		var got []string
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			msg, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, msg.Header.Get(jetstream.MsgIDHeader))
			var data any
			if err := json.Unmarshal(msg.Data, &data); err != nil || !reflect.DeepEqual(data, want) {
				t.Errorf("message %d: data %s, want the payload %s", seq, msg.Data, payload)
			}
			if msg.Subject != name+".order.created" || msg.Header.Get("Postbox-Tenant-Id") != "acme" {
				t.Errorf("message %d: subject %s, headers %v", seq, msg.Subject, msg.Header)
			}
		}
		if !slices.Equal(got, ids) {
			t.Errorf("Nats-Msg-Id of the stream's messages: %v, want the event ids %v", got, ids)
		}
	}
	check()

	if _, err := pool.Exec(context.Background(), `UPDATE outbox SET delivered_at = NULL, next_attempt_at = now()`); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the relay did not send the 5 events again", delivered(10), relay)
	check()
	stopRelay(t, relay)
}

// TestRelayToKafka relays a few events to a Kafka cluster (kfake, in this
// process, on loopback ports): the topic holds each once, keyed by its
// correlation id, with its event id and fields as headers; with the
// brokers stopped the rows stay pending, and they are delivered once the
// brokers are back.
func TestRelayToKafka(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	pool := outboxPool(t, dsn)
	kc := kafkatest.Start(t, 1, "orders")

	payload := `{"order": 3}`
	emit(t, "--db", dsn, "--type", "order.created", "--payload", payload, "--count", "5", "--tenant", "acme", "--correlation-id", "order-3")
	ids := outboxEventIDs(t, pool)

	listen := freePort(t)
	relay := start(t, "relay", "--db", dsn, "--to", kc.URL()+"?topic=orders&client_id=relaytest", "--listen", listen,
		"--poll", "100ms", "--ack-timeout", "2s", "--log-level", "warn")
	delivered := func(n float64) func() bool {
		return func() bool {
			m, err := scrape(listen)
			return err == nil && m[mDelivered] == n && m[mPending] == 0
		}
	}
	waitUntil(t, time.Minute, "the relay did not deliver 5 events", delivered(5), relay)
	var got []string
	for _, r := range kc.Read("orders", 5) {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		got = append(got, h[outboxkafka.HeaderEventID])
		if string(r.Key) != "order-3" || string(r.Value) != payload || h[outboxkafka.HeaderTenantID] != "acme" || h[outboxkafka.HeaderEventType] != "order.created" {
			t.Errorf("record %d: key %q value %s headers %v", r.Offset, r.Key, r.Value, h)
		}
	}
	if !slices.Equal(got, ids) {
		t.Errorf("event ids in the topic: %v, want %v in outbox order", got, ids)
	}

	kc.Stop()
	emit(t, "--db", dsn, "--type", "order.paid", "--payload", payload, "--count", "3", "--correlation-id", "order-3")
	waitUntil(t, time.Minute, "the relay reported no transport failure while the brokers were down", func() bool {
		m, err := scrape(listen)
		return err == nil && m[mPending] == 3 && m[mUnanswered] > 0
	}, relay)
	kc.Restart()
	waitUntil(t, time.Minute, "the relay did not deliver the 3 events after the brokers came back", delivered(8), relay)
	seen := map[string]bool{}
	for _, r := range kc.Read("orders", 8) {
		for _, kv := range r.Headers {
			if kv.Key == outboxkafka.HeaderEventID {
				seen[string(kv.Value)] = true
			}
		}
	}
	if len(seen) != 8 {
		t.Errorf("the topic holds %d distinct events, want 8", len(seen))
	}
	stopRelay(t, relay)
}

// TestRelayEdgeOutboxToKafka relays an edge agent's outbox file to Kafka:
// like a transactional outbox's rows, each record holds the event's
// payload, not its envelope, keyed by its session (the correlation id),
// with its device as the tenant and its ts as the time it was created.
func TestRelayEdgeOutboxToKafka(t *testing.T) {
	kc := kafkatest.Start(t, 1, "orders")
	path := filepath.Join(t.TempDir(), "outbox.db")
	store, err := outboxsqlite.Open(path, outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx) }()
	envs := []postbox.Envelope{
		{SchemaVersion: 1, EventID: "evt_edge_1", Type: "door.opened", TS: "2030-01-02T05:04:05.5+02:00", SessionID: "sess-1", DeviceID: "pi-01",
			Payload: json.RawMessage(`{"door":1}`)},
		{SchemaVersion: 1, EventID: "evt_edge_2", Type: "door.closed", TS: "2030-01-02T03:04:06Z", SessionID: "sess-1", DeviceID: "pi-01",
			Payload: json.RawMessage(`{"door":1,"open_s":12}`)},
	}
	_, err = store.Insert(ctx, envs)
	cancel()
	<-done
	store.Close()
	if err != nil {
		t.Fatal(err)
	}

	listen := freePort(t)
	relay := start(t, "relay", "--db", path, "--to", kc.URL()+"?topic=orders", "--listen", listen, "--poll", "100ms", "--log-level", "warn")
	waitUntil(t, time.Minute, "the relay did not deliver the 2 events", func() bool {
		m, err := scrape(listen)
		return err == nil && m[mDelivered] == 2 && m[mPending] == 0
	}, relay)
	for i, r := range kc.Read("orders", 2) {
		h := map[string]string{}
		for _, kv := range r.Headers {
			h[kv.Key] = string(kv.Value)
		}
		e := envs[i]
		if string(r.Value) != string(e.Payload) || string(r.Key) != e.SessionID || h[outboxkafka.HeaderEventID] != e.EventID ||
			h[outboxkafka.HeaderEventType] != e.Type || h[outboxkafka.HeaderCorrelationID] != e.SessionID || h[outboxkafka.HeaderTenantID] != e.DeviceID ||
			h[outboxkafka.HeaderCreatedAt] != e.Time().UTC().Format(time.RFC3339Nano) {
			t.Errorf("record %d: key %q value %s headers %v; want the payload and fields of %+v", r.Offset, r.Key, r.Value, h, e)
		}
	}
	stopRelay(t, relay)
}

// TestRelayMetrics reads a relay's /metrics while its receiver is down
// (a backlog, an oldest pending age, transport failures) and after it
// came up (all delivered).
func TestRelayMetrics(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	emit(t, "--db", dsn, "--type", "order.created", "--payload", `{"order":5}`, "--count", "20")
	addr, listen := freePort(t), freePort(t)
	relay := start(t, "relay", "--db", dsn, "--to", "ws://"+addr, "--listen", listen, "--poll", "100ms", "--log-level", "error")

	var m map[string]float64
	waitUntil(t, 30*time.Second, "no publish failure while the server is down", func() bool {
		var err error
		m, err = scrape(listen)
		return err == nil && m[mFailures] > 0
	}, relay)
	for _, series := range []string{mPending, mRejectedNow, mOldestAge, mDelivered, mRejected, mUnanswered, mFailures} {
		if _, ok := m[series]; !ok {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	if m[mPending] != 20 || m[mOldestAge] <= 0 || m[mDelivered] != 0 || m[mUnanswered] < 20 {
		t.Errorf("while the server is down: pending %.0f, oldest age %.3fs, delivered %.0f, unanswered %.0f; want 20, > 0, 0, >= 20",
			m[mPending], m[mOldestAge], m[mDelivered], m[mUnanswered])
	}

	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(t.TempDir(), "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)
	waitUntil(t, time.Minute, "the backlog was not delivered once the server came up", func() bool {
		var err error
		m, err = scrape(listen)
		return err == nil && m[mDelivered] == 20 && m[mPending] == 0
	}, relay, srv)
	if m[mOldestAge] != 0 || m[mRejected] != 0 {
		t.Errorf("after delivery: oldest age %.3fs, rejected %.0f; want 0, 0", m[mOldestAge], m[mRejected])
	}
	if resp, err := http.Get("http://" + listen + "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	stopRelay(t, relay)
}

// TestRelayBadInvocations: mistakes in calling postbox relay and postbox
// outbox emit|migrate|list exit 2 (or 1) with a message saying what to do.
func TestRelayBadInvocations(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	_, redisTo, _ := redisStream(t)
	redisBase, _, _ := strings.Cut(redisTo, "?")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.db")
	notDB := filepath.Join(dir, "notadb.txt")
	if err := os.WriteFile(notDB, []byte("not a database\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// The cases run in order on one new schema: the usage errors must leave
	// it as they found it, without an outbox table, which the last two
	// cases check.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"relay"}, 2, "--db and --to are required"},
		{[]string{"relay", "--db", dsn}, 2, "--db and --to are required"},
		{[]string{"relay", "--to", redisTo}, 2, "--db and --to are required"},
		{[]string{"relay", "--db", missing, "--to", "http://127.0.0.1:1"}, 2, "use redis://, nats://, kafka://, ws:// or wss://"},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092"}, 2, "name the topic: kafka://HOST:9092?topic=NAME"},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&partition=1"}, 2, `unknown option "partition"`},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&key=order_id"}, 2, `key="order_id"`},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&max_bytes=big"}, 2, `max_bytes="big"`},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&tls=maybe"}, 2, `tls="maybe"`},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&tls_ca=" + missing}, 2, "tls_ca"},
		{[]string{"relay", "--db", dsn, "--to", "kafka://127.0.0.1:9092?topic=o&sasl_mechanism=plain"}, 2, "sasl_mechanism=plain needs a user"},
		{[]string{"relay", "--db", dsn, "--to", "kafka://u:s3cret@127.0.0.1:9092?topic=o&sasl_mechanism=gssapi"}, 2, `sasl_mechanism="gssapi"`},
		{[]string{"relay", "--db", dsn, "--to", "kafka://u:s3cret@127.0.0.1:9092?topic=or%20ders"}, 2, "u:xxxxx@127.0.0.1:9092"},
		{[]string{"relay", "--db", dsn, "--to", redisBase}, 2, "name the stream: redis://HOST:6379/0?stream=NAME"},
		{[]string{"relay", "--db", dsn, "--to", redisTo + "&maxlen=lots"}, 2, "maxlen"},
		{[]string{"relay", "--db", dsn, "--to", redisTo + "&idmp=maybe"}, 2, "idmp"},
		{[]string{"relay", "--db", dsn, "--to", "nats://127.0.0.1:4222"}, 2, "name the JetStream stream"},
		{[]string{"relay", "--db", dsn, "--to", "nats://127.0.0.1:4222?stream=S&subjet=x"}, 2, `unknown option "subjet"`},
		{[]string{"relay", "--db", dsn, "--to", "nats://127.0.0.1:4222?stream=S&create=nope"}, 2, `create="nope": use true or false`},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--claim", "1s", "--ack-timeout", "2s"}, 2, "--claim (1s) must be longer than --ack-timeout (2s)"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--batch", "0"}, 2, "batch"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--batch", "2000", "--max-in-flight", "10"}, 2, "--max-in-flight (10) must be at least --batch (2000)"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--poll", "0"}, 2, "not a positive duration"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--ack-timeout", "-1s"}, 2, "not a positive duration"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "stray"}, 2, "takes no arguments"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--listen", busy.Addr().String()}, 1, "--listen " + busy.Addr().String()},
		{[]string{"relay", "--db", "Postgres://postgres@127.0.0.1/test", "--to", redisTo}, 2, "postgres:// or postgresql:// URL"},
		{[]string{"relay", "--db", missing, "--to", redisTo}, 1, "no such file"},
		{[]string{"relay", "--db", notDB, "--to", redisTo}, 1, "outbox " + notDB + ": open sqlite"},
		{[]string{"relay", "--db", dsn, "--to", redisTo, "--migrate=false", "--listen", ""}, 1, "no outbox table"},
		{[]string{"outbox", "emit", "--db", dsn, "--type", "t", "--payload", `{"a":`}, 2, "payload is not valid JSON"},
		{[]string{"outbox", "emit", "--db", dsn, "--payload", `{}`}, 2, "--db, --type and --payload are required"},
		{[]string{"outbox", "emit", "--type", "t", "--payload", `{}`}, 2, "--db, --type and --payload are required"},
		{[]string{"outbox", "emit", "--db", dsn, "--type", "t", "--payload", `{}`, "--id", "evt_1", "--count", "2"}, 2, "--id names one event; it cannot go with --count 2"},
		{[]string{"outbox", "emit", "--db", dsn, "--type", "t", "--payload", `{}`, "--count", "0"}, 2, "count"},
		{[]string{"outbox", "emit", "--db", dsn, "--type", "t", "--payload", `{}`, "1000"}, 2, "takes no arguments"},
		{[]string{"outbox", "emit", "--db", "sqlite://" + dir + "/a.db", "--type", "t", "--payload", `{}`}, 2, "postgres:// or postgresql:// URL"},
		{[]string{"outbox", "migrate", "--db", filepath.Join(dir, "x.db")}, 2, "--db must be a postgres:// URL"},
		{[]string{"outbox", "migrate"}, 2, "--db is required"},
		{[]string{"outbox", "list", "--db", dsn, "--outbox", missing}, 2, "--outbox and --db name two outboxes"},
		{[]string{"outbox", "list", "--db", dsn}, 1, "no outbox table"},
	} {
		out, code := runScrubbed(t, tc.args...)
		if strings.Contains(out, "s3cret") {
			t.Errorf("postbox %q printed the password: %q", tc.args, out)
		}
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("postbox %q: exit %d (want %d), output %q (want it to contain %q)", tc.args, code, tc.code, out, tc.want)
		}
	}

	// Without --migrate, the error says the command that creates the
	// table; that command works, and the relay then starts.
	out, code := runScrubbed(t, "relay", "--db", dsn, "--to", redisTo, "--migrate=false", "--listen", "")
	want := "postbox outbox migrate --db '" + dsn + "'"
	if code != 1 || !strings.Contains(out, want) {
		t.Fatalf("relay --migrate=false without a table: exit %d, %q; want it to say %s", code, out, want)
	}
	if out, code := runScrubbed(t, "outbox", "migrate", "--db", dsn); code != 0 || !strings.Contains(out, "outbox table ready") {
		t.Fatalf("outbox migrate: exit %d, %s", code, out)
	}
	if out, code := runScrubbed(t, "outbox", "migrate", "--db", dsn); code != 0 {
		t.Fatalf("outbox migrate, again: exit %d, %s", code, out)
	}
	listen := freePort(t)
	relay := start(t, "relay", "--db", dsn, "--to", redisTo, "--migrate=false", "--listen", listen)
	waitHTTP(t, "http://"+listen+"/healthz", relay)
	stopRelay(t, relay)

	// --state delivered: a transactional outbox in PostgreSQL keeps
	// delivered rows; a SQLite outbox deletes them, and says so.
	if out, code := runScrubbed(t, "outbox", "list", "--db", dsn, "--state", "delivered"); code != 0 || !strings.Contains(out, "EVENT_ID") {
		t.Errorf("outbox list --state delivered (PostgreSQL): exit %d, %s", code, out)
	}
	if rows := listRows(t, "--db", dsn, "--state", "all"); len(rows) != 0 {
		t.Errorf("outbox list --state all of an empty outbox: %v", rows)
	}
	lite := filepath.Join(dir, "service.db")
	out = emit(t, "--db", lite, "--type", "order.created", "--payload", `{"order":9}`, "--id", "evt_lite_1")
	if !strings.Contains(out, "inserted evt_lite_1") {
		t.Errorf("outbox emit (SQLite): %s", out)
	}
	// --outbox on the command line wins over DATABASE_URL.
	if out, code := runWithEnv(t, []string{"DATABASE_URL=" + dsn}, "outbox", "list", "--outbox", lite, "--state", "all"); code != 0 || !strings.Contains(out, "evt_lite_1") {
		t.Errorf("outbox list --outbox FILE with DATABASE_URL set: exit %d, %s; want the file's rows", code, out)
	}
	if out, code := runScrubbed(t, "outbox", "list", "--db", lite, "--state", "delivered"); code != 2 || !strings.Contains(out, "deletes rows when they are delivered") {
		t.Errorf("outbox list --state delivered (SQLite): exit %d, %s; want 2", code, out)
	}
	if rows := listRows(t, "--db", lite, "--state", "pending"); len(rows) != 1 || rows[0]["event_id"] != "evt_lite_1" {
		t.Errorf("outbox list --state pending (SQLite): %v", rows)
	}
	if out, code := runScrubbed(t, "outbox", "emit", "--db", lite, "--type", "order.created", "--payload", `[1]`); code == 0 {
		t.Errorf("outbox emit of a payload that is not an object into a SQLite outbox (whose events must fit a postbox envelope): exit 0, %s", out)
	}
}
