package outboxpg_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
	"github.com/postbox-events/postbox/retry"
)

// setup returns a pool on a fresh schema holding the outbox and a business
// table, orders.
func setup(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, total INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool, dsn
}

func count(t testing.TB, pool *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func event(id string) outbox.Event {
	return outbox.Event{ID: id, Type: "order.created", Payload: []byte(`{"order":"` + id + `","total":42}`), TenantID: "acme"}
}

func TestInsertCommitsAndRollsBackWithTheBusinessWrite(t *testing.T) {
	pool, dsn := setup(t)
	ctx := context.Background()

	// pgx: roll back, then commit.
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("pgx-%v", commit)
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, 42)`, id); err != nil {
			t.Fatal(err)
		}
		if err := outboxpg.InsertPgx(ctx, tx, event(id)); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// database/sql through pgx's stdlib driver: the same.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("sql-%v", commit)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ($1, 42)`, id); err != nil {
			t.Fatal(err)
		}
		if err := outboxpg.Insert(ctx, tx, event(id), event(id+"-b")); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 2 {
		t.Fatalf("%d orders, want the 2 committed", n)
	}
	for _, id := range []string{"pgx-true", "sql-true", "sql-true-b"} {
		if count(t, pool, `SELECT count(*) FROM outbox WHERE event_id = $1 AND delivered_at IS NULL`, id) != 1 {
			t.Errorf("committed event %s is not pending in the outbox", id)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE event_id LIKE '%false%'`); n != 0 {
		t.Fatalf("%d rolled-back events in the outbox", n)
	}
	// The row holds the outbox's columns.
	var typ, corr, tenant, payload string
	if err := pool.QueryRow(ctx, `SELECT event_type, correlation_id, tenant_id, payload::text FROM outbox WHERE event_id = 'pgx-true'`).
		Scan(&typ, &corr, &tenant, &payload); err != nil {
		t.Fatal(err)
	}
	if typ != "order.created" || corr != "pgx-true" || tenant != "acme" || payload != `{"order":"pgx-true","total":42}` {
		t.Fatalf("row: type=%q correlation=%q tenant=%q payload=%s", typ, corr, tenant, payload)
	}
}

func TestInsertRefusesDuplicatesAndBadEvents(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := outboxpg.InsertPgx(ctx, tx, event("a")); err != nil {
		t.Fatal(err)
	}
	err = outboxpg.InsertPgx(ctx, tx, event("b"), event("a"))
	if !errors.Is(err, outbox.ErrDuplicate) || !strings.Contains(err.Error(), ": a") {
		t.Fatalf("insert of a known id: %v, want ErrDuplicate naming a", err)
	}
	for _, tc := range []struct {
		e    outbox.Event
		want string
	}{
		{outbox.Event{Payload: []byte(`{}`)}, "type is empty"},
		{outbox.Event{Type: "x"}, "payload is empty"},
		{outbox.Event{Type: "x", Payload: []byte(`{"a":`)}, "not valid JSON"},
		{outbox.Event{ID: strings.Repeat("i", 200), Type: "x", Payload: []byte(`{}`)}, "id is 200 bytes"},
		{outbox.Event{Type: "x", Payload: []byte("{\"s\":\"\xff\"}")}, "payload is not valid UTF-8"},
		{outbox.Event{Type: "x", TenantID: "acme\x00", Payload: []byte(`{}`)}, "tenant id"},
		{outbox.Event{Type: "x", CorrelationID: "\xc3", Payload: []byte(`{}`)}, "correlation id"},
		{outbox.Event{ID: "a\x00b", Type: "x", Payload: []byte(`{}`)}, `: id "a\x00b"`},
		{outbox.Event{Type: "order\xff", Payload: []byte(`{}`)}, "type"},
	} {
		if err := outboxpg.InsertPgx(ctx, tx, tc.e); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Insert(%+v) = %v, want ErrInvalidEvent with %q", tc.e, err, tc.want)
		}
	}
	// An escaped NUL is JSON text like any other (the payload is kept as
	// text, not jsonb, which refused it): stored as it is.
	if err := outboxpg.InsertPgx(ctx, tx, outbox.Event{ID: "c", Type: "x", Payload: []byte(`{"s":"a\u0000b"}`)}); err != nil {
		t.Fatalf("insert of an escaped NUL: %v", err)
	}
	// The transaction is still usable: b and c went in, and it commits.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 3 {
		t.Fatalf("%d rows, want a, b and c", n)
	}
	// An event without an id gets one.
	e := outbox.Event{Type: "x", Payload: []byte(`{}`)}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		es := []outbox.Event{e}
		if err := outboxpg.InsertPgx(ctx, tx, es...); err != nil {
			return err
		}
		e = es[0]
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(e.ID, "evt_") || e.CorrelationID != e.ID {
		t.Fatalf("prepared event: %+v", e)
	}
}

func newStore(t *testing.T, pool *pgxpool.Pool, cfg outboxpg.Config) *outboxpg.Store {
	t.Helper()
	s, err := outboxpg.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

type pubFunc func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error)

func (f pubFunc) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	return f(ctx, msgs)
}

func runRelay(t *testing.T, s outbox.Store, pub outbox.Publisher, cfg outbox.RelayConfig) {
	t.Helper()
	r, err := outbox.NewRelay(s, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, what, cond)
}

// insertEvents inserts events in one committed transaction.
func insertEvents(t *testing.T, pool *pgxpool.Pool, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outboxpg.InsertPgx(ctx, tx, events...) }); err != nil {
		t.Fatal(err)
	}
}

// listeningStore returns a store running on a pool of its own, once its
// LISTEN connection is up, and the pid of that connection's backend.
func listeningStore(t *testing.T, pool *pgxpool.Pool, dsn string) (*outboxpg.Store, func() int) {
	t.Helper()
	ctx := context.Background()
	app := fmt.Sprintf("outboxpg-listen-%d", time.Now().UnixNano())
	own, err := pgxpool.New(ctx, dsn+"&application_name="+app)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	s := newStore(t, own, outboxpg.Config{})
	listener := func() (pid int) {
		pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query = $2`, app, "LISTEN "+outboxpg.Channel).Scan(&pid)
		return pid
	}
	eventually(t, "the store to listen", func() bool { return listener() != 0 })
	return s, listener
}

// An insert notifies a listening store (the trigger and LISTEN work), and
// a relay hands the rows' fields to the publisher and marks them delivered.
func TestInsertNotifiesAndRelayMarksDelivered(t *testing.T) {
	pool, dsn := setup(t)
	ctx := context.Background()
	s, _ := listeningStore(t, pool, dsn)
	// The store signals once when LISTEN is up; wait for quiet first.
	for quiet := false; !quiet; {
		select {
		case <-s.Notify():
		case <-time.After(200 * time.Millisecond):
			quiet = true
		}
	}
	insertEvents(t, pool, event("n1"), event("n2"))
	select {
	case <-s.Notify():
	case <-time.After(10 * time.Second):
		t.Fatal("no notification after an insert")
	}
	var mu sync.Mutex
	got := map[string]outbox.Message{}
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			got[m.EventID] = m
			out[i] = postbox.Ack(m.EventID, time.Now(), false)
		}
		return out, nil
	})
	runRelay(t, s, pub, outbox.RelayConfig{PollInterval: time.Hour})
	eventually(t, "both rows delivered", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`) == 2
	})
	mu.Lock()
	m := got["n1"]
	mu.Unlock()
	if m.Type != "order.created" || m.TenantID != "acme" || m.CorrelationID != "n1" || string(m.Body) != `{"order":"n1","total":42}` || m.CreatedAt.IsZero() {
		t.Fatalf("message handed to the publisher: %+v body=%s", m, m.Body)
	}
	if p, r, err := s.Counts(ctx); err != nil || p != 0 || r != 0 {
		t.Fatalf("counts: pending=%d rejected=%d err=%v", p, r, err)
	}
	rows, err := s.List(ctx, outbox.StateDelivered, 10)
	if err != nil || len(rows) != 2 || rows[0].EventID != "n1" || rows[0].DeliveredAt == nil || rows[0].State != "delivered" {
		t.Fatalf("delivered rows: %+v, %v", rows, err)
	}
}

func TestClaimsKeepRelaysApartUntilTheyEnd(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	for i := range 10 {
		insertEvents(t, pool, event(fmt.Sprintf("c%d", i)))
	}
	s, err := outboxpg.New(pool, outboxpg.Config{Claim: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var g errgroup.Group
	var mu sync.Mutex
	seen := map[string]int{}
	for range 4 {
		g.Go(func() error {
			msgs, err := s.Due(ctx, now, 0, 3)
			mu.Lock()
			defer mu.Unlock()
			for i, m := range msgs {
				seen[m.EventID]++
				if i > 0 && msgs[i-1].Seq >= m.Seq {
					return fmt.Errorf("due rows out of order: %d then %d", msgs[i-1].Seq, m.Seq)
				}
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s handed out %d times by concurrent claims", id, n)
		}
	}
	if len(seen) != 10 {
		t.Fatalf("%d rows claimed by 4×3, want all 10", len(seen))
	}
	if msgs, _ := s.Due(ctx, now.Add(59*time.Second), 0, 100); len(msgs) != 0 {
		t.Fatalf("%d rows due again while claimed", len(msgs))
	}
	// The relay holding them died: after the claim they are due again.
	if msgs, _ := s.Due(ctx, now.Add(61*time.Second), 0, 100); len(msgs) != 10 {
		t.Fatalf("%d rows due after the claim ended, want 10", len(msgs))
	}
}

func TestPoisonRowIsParkedThenRequeued(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	s := newStore(t, pool, outboxpg.Config{})
	var mu sync.Mutex
	poisoned := true
	sends := map[string]int{}
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			sends[m.EventID]++
			out[i] = postbox.Ack(m.EventID, time.Now(), false)
			if m.EventID == "poison" && poisoned {
				out[i] = postbox.Nack(m.EventID, errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"))
			}
		}
		return out, nil
	})
	fast := retry.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}
	runRelay(t, s, pub, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Retry: fast, MaxAttempts: 4})
	insertEvents(t, pool, event("ok-1"), event("poison"), event("ok-2"))
	eventually(t, "the poison row parked", func() bool {
		_, r, _ := s.Counts(ctx)
		return r == 1
	})
	rows, err := s.List(ctx, outbox.StateRejected, 10)
	if err != nil || len(rows) != 1 {
		t.Fatalf("rejected rows: %+v, %v", rows, err)
	}
	r := rows[0]
	if r.EventID != "poison" || r.Attempts != 4 || !strings.Contains(r.LastError, "parked after 4 attempts") || !strings.Contains(r.LastError, "WRONGTYPE") {
		t.Fatalf("parked row: %+v", r)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`); n != 2 {
		t.Fatalf("%d rows delivered, want the 2 healthy ones", n)
	}
	// Parked means not looping: no send after the fourth.
	mu.Lock()
	n := sends["poison"]
	poisoned = false
	mu.Unlock()
	if n != 4 {
		t.Fatalf("poison sent %d times, want 4", n)
	}
	if k, err := s.Requeue(ctx, []string{"poison"}); err != nil || k != 1 {
		t.Fatalf("requeue: %d, %v", k, err)
	}
	eventually(t, "the requeued row delivered", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`) == 3
	})
}

// An outage longer than MaxAttempts sends does not park a row: transport
// failures are not attempts, so the refusal that follows the outage is the
// row's first, and it is retried, then delivered.
func TestOutageDoesNotParkRows(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	s := newStore(t, pool, outboxpg.Config{})
	var mu sync.Mutex
	calls := 0
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 6 {
			return nil, errors.New("dial tcp 127.0.0.1:6379: connection refused")
		}
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = postbox.Ack(m.EventID, time.Now(), false)
			if calls == 7 {
				out[i] = postbox.Nack(m.EventID, errors.New("busy"))
			}
		}
		return out, nil
	})
	fast := retry.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}
	runRelay(t, s, pub, outbox.RelayConfig{PollInterval: 10 * time.Millisecond, Retry: fast, Reconnect: fast, MaxAttempts: 2})
	insertEvents(t, pool, event("through-an-outage"))
	eventually(t, "the row delivered", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`) == 1
	})
	rows, err := s.List(ctx, "", 10)
	if err != nil || len(rows) != 1 || rows[0].Attempts != 1 || rows[0].LastError == "" {
		t.Fatalf("rows: %+v, %v; want one delivered after 1 counted attempt (the refusal), its last error kept", rows, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 8 {
		t.Fatalf("%d publishes, want 6 failed, 1 refused, 1 delivered", calls)
	}
}

func TestRetentionDeletesOnlyOldDeliveredRows(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var es []outbox.Event
		for i := range 2500 {
			es = append(es, event(fmt.Sprintf("r%04d", i)))
		}
		return outboxpg.InsertPgx(ctx, tx, es...)
	}); err != nil {
		t.Fatal(err)
	}
	// 2100 delivered two days ago, 100 delivered now, 300 pending.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET delivered_at = now() - interval '2 days' WHERE event_id < 'r2100'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox SET delivered_at = now() WHERE event_id >= 'r2100' AND event_id < 'r2200'`); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan int64, 1)
	newStore(t, pool, outboxpg.Config{Retention: 24 * time.Hour, ObserveRetention: func(n int64) {
		select {
		case deleted <- n:
		default:
		}
	}})
	select {
	case n := <-deleted:
		if n != 2100 {
			t.Fatalf("retention deleted %d, want 2100", n)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no retention pass")
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 400 {
		t.Fatalf("%d rows left, want 400", n)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if ok, err := outboxpg.Exists(ctx, pool); err != nil || ok {
		t.Fatalf("Exists before Migrate: %v, %v", ok, err)
	}
	var g errgroup.Group
	for range 3 {
		g.Go(func() error { return outboxpg.Migrate(ctx, pool) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := outboxpg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if ok, err := outboxpg.Exists(ctx, pool); err != nil || !ok {
		t.Fatalf("Exists after Migrate: %v, %v", ok, err)
	}
}

// A table named outbox that is not postbox's (a hand-made shape, made by
// hand) is named as such by Exists and Migrate, not a bare SQL error.
func TestMigrateRefusesAnotherOutboxTable(t *testing.T) {
	dsn := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE outbox (id UUID PRIMARY KEY, event_type TEXT, event_id UUID UNIQUE,
		payload JSONB, correlation_id UUID, tenant_id TEXT, created_at TIMESTAMPTZ, delivered_at TIMESTAMPTZ)`); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Exists":  func() error { _, err := outboxpg.Exists(ctx, pool); return err }(),
		"Migrate": outboxpg.Migrate(ctx, pool),
	} {
		if err == nil || !strings.Contains(err.Error(), "not postbox's outbox: it has no column seq") {
			t.Errorf("%s over a hand-made table: %v; want an error naming the missing column", name, err)
		}
	}
}

// A relay whose claim ended while it was still sending settles late, after
// another relay claimed the row: its retry, refusal or transport failure
// leaves the other relay's claim alone (the row is not due again, nor
// parked, while the other send is in flight), and the other relay's
// delivery stands. A late delivery applies, also over a refusal.
func TestLateSettleLeavesAnotherRelaysClaimAlone(t *testing.T) {
	pool, _ := setup(t)
	ctx := context.Background()
	insertEvents(t, pool, event("late"), event("late-2"))
	s, err := outboxpg.New(pool, outboxpg.Config{Claim: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	first, _ := s.Due(ctx, now, 0, 10)
	second, _ := s.Due(ctx, now.Add(2*time.Second), 0, 10) // the first claim ended
	if len(first) != 2 || len(second) != 2 || first[0].Lease.IsZero() || !second[0].Lease.After(first[0].Lease) {
		t.Fatalf("claims: %+v then %+v; want both rows twice, the second lease later", first, second)
	}
	stale := []outbox.Outcome{
		{EventID: "late", Kind: outbox.Retry, Error: "timeout", RetryAt: now, Lease: first[0].Lease},
		{EventID: "late", Kind: outbox.Unanswered, Error: "connection reset", Lease: first[0].Lease},
		{EventID: "late", Kind: outbox.Rejected, Error: "parked", Lease: first[0].Lease},
		{EventID: "late", Kind: outbox.Retry, Error: "no lease"},
	}
	for _, o := range stale {
		if err := s.Settle(ctx, []outbox.Outcome{o}); err != nil {
			t.Fatal(err)
		}
	}
	row := func(id string) outbox.Row {
		t.Helper()
		rows, err := s.List(ctx, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.EventID == id {
				return r
			}
		}
		t.Fatalf("%s not listed", id)
		return outbox.Row{}
	}
	if r := row("late"); r.State != outbox.StatePending || r.Attempts != 0 || r.LastError != "" || !r.NextAttemptAt.Equal(second[0].Lease) {
		t.Fatalf("after stale outcomes: %+v; want untouched, still claimed until %s", r, second[0].Lease)
	}
	if msgs, _ := s.Due(ctx, now.Add(2*time.Second), 0, 10); len(msgs) != 0 {
		t.Fatalf("%d rows due again while the second relay holds them", len(msgs))
	}
	if err := s.Settle(ctx, []outbox.Outcome{
		{EventID: "late", Kind: outbox.Delivered, Lease: second[0].Lease},
		{EventID: "late-2", Kind: outbox.Rejected, Error: "invalid_field: x", Lease: second[1].Lease},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, []outbox.Outcome{
		{EventID: "late", Kind: outbox.Retry, Error: "timeout", RetryAt: now, Lease: second[0].Lease},
		{EventID: "late-2", Kind: outbox.Delivered, Lease: first[1].Lease},
	}); err != nil {
		t.Fatal(err)
	}
	if r := row("late"); r.State != outbox.StateDelivered || r.Attempts != 0 || r.LastError != "" {
		t.Fatalf("after a retry outcome for a delivered row: %+v; want delivered, untouched", r)
	}
	if r := row("late-2"); r.State != outbox.StateDelivered {
		t.Fatalf("a late delivery of a rejected row: %+v; want delivered", r)
	}
}

// The store's LISTEN connection is killed: it dials again, and an insert
// still wakes a relay that would otherwise not poll for an hour.
func TestListenSurvivesALostConnection(t *testing.T) {
	pool, dsn := setup(t)
	ctx := context.Background()
	s, listener := listeningStore(t, pool, dsn)
	delivered := make(chan string, 10)
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = postbox.Ack(m.EventID, time.Now(), false)
			delivered <- m.EventID
		}
		return out, nil
	})
	runRelay(t, s, pub, outbox.RelayConfig{PollInterval: time.Hour})
	killed := listener()
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, killed); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the store to listen again", func() bool { p := listener(); return p != 0 && p != killed })
	insertEvents(t, pool, event("after-reconnect"))
	select {
	case id := <-delivered:
		if id != "after-reconnect" {
			t.Fatalf("delivered %s", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("an insert after the LISTEN connection was killed did not wake the relay")
	}
}
