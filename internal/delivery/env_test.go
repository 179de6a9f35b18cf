package delivery_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// storeKind is the kind of store delivery keeps its state in. The streams
// are a streamsqlite database whatever the store.
type storeKind string

const (
	sqliteStore   storeKind = "sqlite"   // a SQLite database: the streams' own unless a test says otherwise
	postgresStore storeKind = "postgres" // a new schema of the test PostgreSQL (POSTBOX_TEST_POSTGRES)
)

// eachStore runs test once on each kind of store, as the subtests sqlite
// and postgres.
func eachStore(t *testing.T, test func(t *testing.T, kind storeKind)) {
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		t.Run(string(kind), func(t *testing.T) { test(t, kind) })
	}
}

// clock is a settable time source.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// env runs delivery on a test clock, reading its events from streams and
// keeping its state in a store of kind.
type env struct {
	kind    storeKind
	streams *streamsqlite.Backend // the stream backend, unwrapped
	state   delivery.Store        // delivery's store: streams itself, another SQLite database, or PostgreSQL
	stateAt string                // where state is: what openOptions.state says, to open it again
	d       *delivery.Delivery
	clock   *clock
	stop    func() // stops delivery and closes the databases; the end of the test does too
	halt    func() // stops delivery (Run returns) and leaves the databases open
}

// openOptions say where an env keeps its data.
type openOptions struct {
	streams string // the streams' database file; "": a new one
	// state is where delivery's state is: on SQLite a database file ("":
	// the streams' own), on PostgreSQL the URL of a schema ("": a new
	// schema, dropped at the end of the test).
	state string
	wrap  func(stream.Backend) stream.Backend // what delivery reads the streams through; nil: the backend itself
	cfg   delivery.Config
	sync  string // the SQLite databases' synchronous mode; "": FULL
}

// setup runs delivery with its state in a store of kind until the test
// ends.
func setup(t testing.TB, kind storeKind, cfg delivery.Config) *env {
	t.Helper()
	return open(t, kind, openOptions{cfg: cfg})
}

// open runs streams and delivery as o says until e.stop or the end of the
// test. A PostgreSQL store skips the test when POSTBOX_TEST_POSTGRES is
// not set.
func open(t testing.TB, kind storeKind, o openOptions) *env {
	t.Helper()
	if o.streams == "" {
		o.streams = filepath.Join(t.TempDir(), "p.db")
	}
	if kind == postgresStore && o.state == "" {
		o.state = testenv.PostgresSchema(t) // before anything that its drop must follow
	}
	c := newClock()
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	var closers []func() error
	openSQLite := func(path string) *streamsqlite.Backend {
		b, err := streamsqlite.Open(path, streamsqlite.Config{Now: c.Now, Synchronous: o.sync})
		if err != nil {
			t.Fatal(err)
		}
		running.Go(func() { b.Run(ctx) })
		closers = append(closers, b.Close)
		return b
	}
	streams := openSQLite(o.streams)
	var state delivery.Store = streams
	switch {
	case kind == postgresStore:
		pg, err := deliverypg.Open(ctx, deliverypg.Config{URL: o.state, Schema: schemaOf(t, o.state)})
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, pg.Close)
		state = pg
	case o.state != "" && o.state != o.streams:
		state = openSQLite(o.state)
	}
	if _, err := streams.EnsureStream(ctx, "devices"); err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	var read stream.Backend = streams
	if o.wrap != nil {
		read = o.wrap(streams)
	}
	d, err := delivery.New(ctx, read, state, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dctx, stopDelivery := context.WithCancel(ctx)
	dDone := make(chan struct{})
	go func() { defer close(dDone); d.Run(dctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopDelivery()
			<-dDone
			cancel()
			running.Wait()
			for _, c := range closers {
				c()
			}
		})
	}
	t.Cleanup(stop)
	halt := func() { stopDelivery(); <-dDone }
	return &env{kind: kind, streams: streams, state: state, stateAt: o.state, d: d, clock: c, stop: stop, halt: halt}
}

// schemaOf returns the schema of a URL from testenv.PostgresSchema.
func schemaOf(t testing.TB, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.Query().Get("search_path")
}

// bind writes the ? parameters of q as the store's: $1, $2… on
// PostgreSQL.
func (e *env) bind(q string) string {
	if e.kind != postgresStore {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// count runs q, a query of one number with ? parameters, on delivery's
// store.
func (e *env) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.state.ReadDB().QueryRow(e.bind(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// countStreams runs q, a query of one number, on the streams' database.
func (e *env) countStreams(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.streams.ReadDB().QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// exec runs q, a statement with ? parameters, in a write transaction of
// delivery's store, as an operator or another program would.
func (e *env) exec(t testing.TB, q string, args ...any) {
	t.Helper()
	if err := e.state.Update(context.Background(), func(tx *sql.Tx) error {
		_, err := tx.Exec(e.bind(q), args...)
		return err
	}); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// appendEvents appends n events of type typ with ids prefix-0.. in
// batches of 500.
func (e *env) appendEvents(t testing.TB, prefix, typ string, n int) {
	t.Helper()
	for i := 0; i < n; {
		var evs []stream.Event
		for ; i < n && len(evs) < 500; i++ {
			evs = append(evs, stream.Event{NativeID: fmt.Sprintf("%s-%d", prefix, i), Type: typ, OccurredAt: time.Now(),
				Metadata: json.RawMessage(fmt.Sprintf(`{"device_id":"pi-%d"}`, i%3)), Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)),
				DeliveryHandle: json.RawMessage(`{"reply_to":"pi"}`)})
		}
		res, err := e.streams.Append(context.Background(), "devices", evs)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil || r.Duplicate {
				t.Fatalf("append: %+v", r)
			}
		}
	}
}

func (e *env) create(t testing.TB, s delivery.Subscription) delivery.Subscription {
	t.Helper()
	got, created, err := e.d.Create(context.Background(), s)
	if err != nil || !created {
		t.Fatalf("create %s: created=%v %v", s.Name, created, err)
	}
	return got
}

// waitLag waits until sub's lag is want, for as long as the lag keeps
// moving: how long a loop takes to consume a backlog depends on the
// machine (see testenv.Progressing), a loop that stops does not.
func (e *env) waitLag(t testing.TB, sub string, want int64) {
	t.Helper()
	testenv.Progressing(t, stallTimeout, sub+" to catch up", func() (bool, int64) {
		lag, err := e.d.Lag(context.Background(), sub)
		if err != nil {
			return false, -1
		}
		return lag.Events == want, lag.Events
	})
}

// stallTimeout is how long a wait for delivery's work goes without
// progress before it fails. One step is a batch of the writer's: under
// -race, SQLite (modernc) spends most of a second of CPU on a batch of
// 1,000 items, and TestTwoSubscriptionsIndependent's 5,000 events cost
// 11 s of CPU in all; on two cores at load 30 a step took over 30 s, and
// the fixed 30 s the waits had for the whole backlog failed at load 20.
const stallTimeout = 2 * time.Minute

// waitConsumer waits until the stream consumer of sub is at next.
func (e *env) waitConsumer(t testing.TB, sub string, next int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, sub+"'s stream consumer to follow its position", func() bool {
		c, err := e.streams.Consumer(context.Background(), sub)
		return err == nil && c.NextOffset == next
	})
}

// checkOnce checks that sub holds one item for each offset from 1 to n,
// and that its kept counts count each item once.
func (e *env) checkOnce(t testing.TB, sub string, n int) {
	t.Helper()
	if got := e.count(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = ?`, sub); got != n {
		t.Fatalf("%s has %d items, want %d", sub, got, n)
	}
	if got := e.count(t, `SELECT count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = ? AND "offset" BETWEEN 1 AND ?`, sub, n); got != n {
		t.Fatalf("%s has items for %d distinct offsets of 1..%d", sub, got, n)
	}
	if got := e.count(t, `SELECT coalesce(sum(pending + processing + completed + failed), 0) FROM item_counts c
		JOIN subscriptions s ON s.subscription_uid = c.subscription_uid WHERE s.subscription_id = ?`, sub); got != n {
		t.Fatalf("%s's kept counts count %d items, want %d", sub, got, n)
	}
}

// hookInline has the items of subscription name (created, its loop
// running) written with their events, as serve's default subscription's
// are (InlineHook).
func (e *env) hookInline(t testing.TB, name string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the loop to record its position", func() bool {
		return e.count(t, `SELECT count(*) FROM positions WHERE subscription_id = ?`, name) == 1
	})
	fn, err := e.d.InlineHook(context.Background(), name)
	if err != nil || fn == nil {
		t.Fatalf("InlineHook: %v, %v", fn != nil, err)
	}
	e.streams.Hook("devices", fn)
}
