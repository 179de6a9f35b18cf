package intake_test

import (
	"context"
	"database/sql"
	"io/fs"
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
	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// storeKind is the kind of store intake and delivery keep their state
// in. The streams are a streamsqlite database whatever the store.
type storeKind string

const (
	sqliteStore   storeKind = "sqlite"   // the streams' own SQLite database
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

// env is intake's store beside delivery, on a test clock, with the
// streams in a SQLite database and the state in a store of kind.
type env struct {
	kind    storeKind
	streams *streamsqlite.Backend
	state   delivery.Store
	stateAt string // where state is, to open it again: "" for the streams' own, a schema's URL on PostgreSQL
	d       *delivery.Delivery
	st      *intake.Store
	clock   *clock
	stop    func() // stops delivery and closes the databases; the end of the test does too
}

// openOptions say where an env keeps its data.
type openOptions struct {
	streams string // the streams' database file; "": a new one
	state   string // PostgreSQL: the URL of a schema; "": a new one
	// before, when set, runs on the store before delivery and intake
	// migrate it (old migrations, rows of an older version).
	before func(t testing.TB, state delivery.Store)
	// intakeFirst opens intake's store before delivery.
	intakeFirst bool
}

// open runs the streams, delivery and intake's store as o says until
// e.stop or the end of the test. A PostgreSQL store skips the test when
// POSTBOX_TEST_POSTGRES is not set.
func open(t testing.TB, kind storeKind, o openOptions) *env {
	t.Helper()
	if o.streams == "" {
		o.streams = filepath.Join(t.TempDir(), "p.db")
	}
	if kind == postgresStore && o.state == "" {
		o.state = testenv.PostgresSchema(t)
	}
	c := newClock()
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	var closers []func() error
	streams, err := streamsqlite.Open(o.streams, streamsqlite.Config{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	running.Go(func() { streams.Run(ctx) })
	closers = append(closers, streams.Close)
	var state delivery.Store = streams
	if kind == postgresStore {
		pg, err := deliverypg.Open(ctx, deliverypg.Config{URL: o.state, Schema: schemaOf(t, o.state)})
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, pg.Close)
		state = pg
	}
	if o.before != nil {
		o.before(t, state)
	}
	e := &env{kind: kind, streams: streams, state: state, stateAt: o.state, clock: c}
	openIntake := func() {
		e.st, err = intake.Open(ctx, state, streams, intake.StoreConfig{PostgreSQL: kind == postgresStore, Now: c.Now,
			Readers: func(ctx context.Context, tx *sql.Tx, source string) ([]string, error) {
				return e.d.ReadersOf(ctx, tx, source)
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if o.intakeFirst {
		openIntake()
	}
	e.d, err = delivery.New(ctx, streams, state, delivery.Config{Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	if !o.intakeFirst {
		openIntake()
	}
	dctx, stopDelivery := context.WithCancel(ctx)
	dDone := make(chan struct{})
	go func() { defer close(dDone); e.d.Run(dctx) }()
	var once sync.Once
	e.stop = func() {
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
	t.Cleanup(e.stop)
	return e
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
func bind(kind storeKind, q string) string {
	if kind != postgresStore {
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

// count runs q, a query of one number with ? parameters, on the store.
func (e *env) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.state.ReadDB().QueryRow(bind(e.kind, q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// exec runs q, a statement with ? parameters, in a write transaction of
// state, as an older version or an operator would.
func exec(t testing.TB, kind storeKind, state delivery.Store, q string, args ...any) {
	t.Helper()
	if err := state.Update(context.Background(), func(tx *sql.Tx) error {
		_, err := tx.Exec(bind(kind, q), args...)
		return err
	}); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// subFS returns the directory dir of fsys.
func subFS(t testing.TB, fsys fs.FS, dir string) fs.FS {
	t.Helper()
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}
