// White-box only to read the pragmas on the store's own connection; every
// other test uses the exported API.
package outboxsqlite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/outbox"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 123456000, time.UTC)} }

// run runs s's writer and returns a function that stops it and closes s.
func run(t testing.TB, s *Store) (closeStore func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	var once sync.Once
	closeStore = func() {
		once.Do(func() {
			cancel()
			<-done
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
	t.Cleanup(closeStore)
	return closeStore
}

func open(t testing.TB, path string, cfg Config) (*Store, func()) {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "outbox.db")
	}
	s, err := Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, run(t, s)
}

func env(id, payload string) postbox.Envelope {
	return postbox.Envelope{
		SchemaVersion: postbox.SchemaVersion, EventID: id, Type: "test.event",
		TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "dev-1",
		Payload: json.RawMessage(payload),
	}
}

// insertOK inserts an envelope of each id, one call each.
func insertOK(t testing.TB, s *Store, ids ...string) {
	t.Helper()
	for _, id := range ids {
		insertNew(t, s, env(id, `{"n":1}`))
	}
}

// insertNew inserts envs in one call and fails unless each is new,
// answered in order.
func insertNew(t testing.TB, s *Store, envs ...postbox.Envelope) {
	t.Helper()
	res, err := s.Insert(context.Background(), envs)
	if err != nil || len(res) != len(envs) {
		t.Fatalf("insert %d envelopes: %+v %v", len(envs), res, err)
	}
	for i, r := range res {
		if r.Err != nil || r.Duplicate || r.EventID != envs[i].EventID {
			t.Fatalf("insert %s: %+v", envs[i].EventID, r)
		}
	}
}

func list(t testing.TB, s *Store, state string) map[string]Row {
	t.Helper()
	rows, err := s.List(context.Background(), state, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Row{}
	for _, r := range rows {
		out[r.EventID] = r
	}
	return out
}

func dueIDs(t testing.TB, s *Store, now time.Time, after int64, limit int) ([]string, []outbox.Message) {
	t.Helper()
	msgs, err := s.Due(context.Background(), now, after, limit)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, m := range msgs {
		ids = append(ids, m.EventID)
	}
	return ids, msgs
}

func wantCounts(t testing.TB, s *Store, pending, rejected int64) {
	t.Helper()
	p, r, err := s.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p != pending || r != rejected {
		t.Fatalf("Counts = %d pending, %d rejected; want %d, %d", p, r, pending, rejected)
	}
}

func TestPragmas(t *testing.T) {
	for _, tc := range []struct {
		sync string
		want int
		wal  bool // the group commit syncs the log itself
	}{{"", 1, true}, {"FULL", 1, true}, {"NORMAL", 1, false}} {
		// FULL: the connection commits as NORMAL and the group commit
		// syncs the write-ahead log before it answers.
		s, _ := open(t, "", Config{Synchronous: tc.sync})
		insertOK(t, s, "evt-1") // the writer has used the connection
		mode, sync, busy, err := sqlitedb.Pragmas(context.Background(), s.db)
		if err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || sync != tc.want || busy != 5000 || (s.wal != nil) != tc.wal {
			t.Fatalf("Synchronous %q: journal_mode=%s synchronous=%d busy_timeout=%d, syncs the log itself %v; want wal, %d, 5000, %v",
				tc.sync, mode, sync, busy, s.wal != nil, tc.want, tc.wal)
		}
	}
	if _, err := Open(filepath.Join(t.TempDir(), "outbox.db"), Config{Synchronous: "OFF"}); err == nil {
		t.Fatal("Open with synchronous OFF succeeded; want an error")
	}
}

func TestInsertDuplicateAndConflict(t *testing.T) {
	s, _ := open(t, "", Config{})
	ctx := context.Background()
	first := env("evt-1", `{"a":1}`)
	res, err := s.Insert(ctx, []postbox.Envelope{first})
	if err != nil || res[0].Duplicate || res[0].Err != nil {
		t.Fatalf("first insert: %+v %v", res, err)
	}
	res, err = s.Insert(ctx, []postbox.Envelope{first})
	if err != nil || !res[0].Duplicate || res[0].Err != nil || res[0].EventID != "evt-1" {
		t.Fatalf("same envelope again: %+v %v; want Duplicate", res, err)
	}
	other := env("evt-1", `{"a":2}`)
	other.Type = "other.type"
	res, err = s.Insert(ctx, []postbox.Envelope{env("evt-2", `{}`), other, env("evt-3", `{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res[1].Err, ErrConflict) || res[1].Duplicate {
		t.Fatalf("same event_id, other envelope: %+v; want ErrConflict", res[1])
	}
	if res[0].Err != nil || res[2].Err != nil || res[0].Duplicate || res[2].Duplicate {
		t.Fatalf("the other events of the batch: %+v, want both queued", res)
	}
	rows := list(t, s, "")
	if len(rows) != 3 {
		t.Fatalf("rows: %v, want evt-1..3", rows)
	}
	if r := rows["evt-1"]; string(r.Payload) != `{"a":1}` || r.Type != "test.event" || r.CorrelationID != "sess-1" || r.TenantID != "dev-1" || r.Attempts != 0 || r.State != StatePending {
		t.Fatalf("evt-1 after the conflict: %+v; want the first event unchanged", r)
	}
}

func TestDueOrderAndCursor(t *testing.T) {
	clk := newClock()
	s, _ := open(t, "", Config{Now: clk.Now})
	insertOK(t, s, "evt-c", "evt-a", "evt-e", "evt-b", "evt-d") // insert order, not id order

	ids, msgs := dueIDs(t, s, clk.Now(), 0, 100)
	if want := []string{"evt-c", "evt-a", "evt-e", "evt-b", "evt-d"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("Due = %v, want insert order %v", ids, want)
	}
	for i, m := range msgs {
		if i > 0 && m.Seq <= msgs[i-1].Seq {
			t.Fatalf("Seq not growing: %+v", msgs)
		}
		if string(m.Body) != `{"n":1}` || m.Type != "test.event" || m.Attempts != 0 || m.CorrelationID != "sess-1" || m.TenantID != "dev-1" ||
			m.SourceSeq != nil || m.CreatedAt.Format(time.RFC3339Nano) != "2030-01-02T03:04:05Z" {
			t.Fatalf("message %d: %+v (body %s); want the payload and the envelope's fields", i, m, m.Body)
		}
	}
	if ids, _ := dueIDs(t, s, clk.Now(), msgs[1].Seq, 2); !reflect.DeepEqual(ids, []string{"evt-e", "evt-b"}) {
		t.Fatalf("Due after %d limit 2 = %v, want [evt-e evt-b]", msgs[1].Seq, ids)
	}
	if ids, _ := dueIDs(t, s, clk.Now(), msgs[4].Seq, 10); len(ids) != 0 {
		t.Fatalf("Due after the last row = %v, want none", ids)
	}
	if ids, _ := dueIDs(t, s, clk.Now().Add(-time.Microsecond), 0, 10); len(ids) != 0 {
		t.Fatalf("Due before the rows were created = %v, want none", ids)
	}
}

func TestSettleKinds(t *testing.T) {
	clk := newClock()
	s, _ := open(t, "", Config{Now: clk.Now})
	insertOK(t, s, "evt-delivered", "evt-rejected", "evt-retry", "evt-unanswered", "evt-untouched")
	retryAt := clk.Now().Add(time.Minute)
	clk.Add(time.Second)
	err := s.Settle(context.Background(), []outbox.Outcome{
		{EventID: "evt-delivered", Kind: outbox.Delivered},
		{EventID: "evt-rejected", Kind: outbox.Rejected, Error: "invalid_field: ts: bad"},
		{EventID: "evt-retry", Kind: outbox.Retry, Error: "unavailable: busy", RetryAt: retryAt},
		{EventID: "evt-unanswered", Kind: outbox.Unanswered, Error: "connection reset"},
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := list(t, s, "")
	if _, ok := rows["evt-delivered"]; ok {
		t.Fatal("the delivered row is still in the outbox")
	}
	check := func(id, state string, attempts int, lastErr string) Row {
		t.Helper()
		r, ok := rows[id]
		if !ok || r.State != state || r.Attempts != attempts || r.LastError != lastErr {
			t.Fatalf("%s = %+v (present %v); want state %s, %d attempts, last_error %q", id, r, ok, state, attempts, lastErr)
		}
		return r
	}
	check("evt-rejected", StateRejected, 1, "invalid_field: ts: bad")
	if r := check("evt-retry", StatePending, 1, "unavailable: busy"); !r.NextAttemptAt.Equal(retryAt) {
		t.Fatalf("evt-retry next_attempt_at = %s, want %s", r.NextAttemptAt, retryAt)
	}
	check("evt-unanswered", StatePending, 0, "connection reset") // a transport failure is not an attempt
	check("evt-untouched", StatePending, 0, "")
	wantCounts(t, s, 3, 1)

	ids, _ := dueIDs(t, s, clk.Now(), 0, 10)
	if !reflect.DeepEqual(ids, []string{"evt-unanswered", "evt-untouched"}) {
		t.Fatalf("Due now = %v, want the unanswered and untouched rows (not the rejected one, not the retry before its time)", ids)
	}
	if ids, _ := dueIDs(t, s, retryAt, 0, 10); !reflect.DeepEqual(ids, []string{"evt-retry", "evt-unanswered", "evt-untouched"}) {
		t.Fatalf("Due at the retry time = %v", ids)
	}

	// A refusal counts another attempt, and Due carries the count.
	if err := s.Settle(context.Background(), []outbox.Outcome{{EventID: "evt-unanswered", Kind: outbox.Retry, Error: "unavailable: busy", RetryAt: clk.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, msgs := dueIDs(t, s, clk.Now(), 0, 1); len(msgs) != 1 || msgs[0].EventID != "evt-unanswered" || msgs[0].Attempts != 1 || list(t, s, "")["evt-unanswered"].LastError != "unavailable: busy" {
		t.Fatalf("after a refusal, Due = %+v; want evt-unanswered with 1 attempt", msgs)
	}
}

// Delivered outcomes with their seq delete their rows by runs of
// consecutive seqs, out of order and with gaps, and no other row; those
// without a seq go by id.
func TestSettleDeliveredBySeq(t *testing.T) {
	clk := newClock()
	s, _ := open(t, "", Config{Now: clk.Now})
	ids := []string{"evt-1", "evt-2", "evt-3", "evt-4", "evt-5", "evt-6", "evt-7", "evt-8"}
	insertOK(t, s, ids...)
	_, msgs := dueIDs(t, s, clk.Now(), 0, 10)
	if len(msgs) != len(ids) {
		t.Fatalf("Due = %d messages, want %d", len(msgs), len(ids))
	}
	var out []outbox.Outcome
	for _, i := range []int{5, 1, 0, 2, 6, 4, 2} { // evt-4 and evt-8 not; evt-3 twice
		out = append(out, outbox.Outcome{EventID: msgs[i].EventID, Seq: msgs[i].Seq, Kind: outbox.Delivered})
	}
	out = append(out, outbox.Outcome{EventID: "evt-8", Kind: outbox.Delivered}) // no seq: by id
	if err := s.Settle(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(list(t, s, ""))); !reflect.DeepEqual(got, []string{"evt-4"}) {
		t.Fatalf("rows left = %v, want [evt-4]", got)
	}
}

func TestListCountsRequeue(t *testing.T) {
	clk := newClock()
	s, _ := open(t, "", Config{Now: clk.Now})
	insertOK(t, s, "evt-r1", "evt-p", "evt-r2", "evt-r3")
	var out []outbox.Outcome
	for _, id := range []string{"evt-r1", "evt-r2", "evt-r3"} {
		out = append(out, outbox.Outcome{EventID: id, Kind: outbox.Rejected, Error: "too_large: " + id})
	}
	if err := s.Settle(context.Background(), out); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, 1, 3)
	rows, err := s.List(context.Background(), StateRejected, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.EventID)
	}
	if !reflect.DeepEqual(got, []string{"evt-r1", "evt-r2", "evt-r3"}) {
		t.Fatalf("List(rejected) = %v, want oldest first", got)
	}
	if rows, _ := s.List(context.Background(), StatePending, 10); len(rows) != 1 || rows[0].EventID != "evt-p" {
		t.Fatalf("List(pending) = %+v", rows)
	}
	if rows, _ := s.List(context.Background(), "", 2); len(rows) != 2 || rows[0].EventID != "evt-r1" || rows[1].EventID != "evt-p" {
		t.Fatalf("List(all, 2) = %+v", rows)
	}

	drain(s)
	clk.Add(time.Hour)
	n, err := s.Requeue(context.Background(), []string{"evt-r2", "evt-p", "evt-unknown"})
	if err != nil || n != 1 {
		t.Fatalf("Requeue(evt-r2, a pending and an unknown id) = %d, %v; want 1", n, err)
	}
	select {
	case <-s.Notify():
	default:
		t.Fatal("Requeue did not notify")
	}
	r := list(t, s, "")["evt-r2"]
	if r.State != StatePending || !r.NextAttemptAt.Equal(clk.Now()) || r.Attempts != 0 || r.LastError == "" {
		t.Fatalf("requeued row = %+v; want pending, due now (%s), attempts from zero, its last error kept", r, clk.Now())
	}
	if ids, _ := dueIDs(t, s, clk.Now(), 0, 10); !reflect.DeepEqual(ids, []string{"evt-p", "evt-r2"}) {
		t.Fatalf("Due after requeue = %v", ids)
	}
	wantCounts(t, s, 2, 2)

	n, err = s.Requeue(context.Background(), nil)
	if err != nil || n != 2 {
		t.Fatalf("Requeue(all) = %d, %v; want 2", n, err)
	}
	wantCounts(t, s, 4, 0)
	drain(s)
	if n, err := s.Requeue(context.Background(), nil); err != nil || n != 0 {
		t.Fatalf("Requeue with nothing rejected = %d, %v", n, err)
	}
	select {
	case <-s.Notify():
		t.Fatal("Requeue of nothing notified")
	default:
	}
}

func drain(s *Store) {
	select {
	case <-s.Notify():
	default:
	}
}

func TestRowsSurviveReopen(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, closeStore := open(t, path, Config{Now: clk.Now})
	insertOK(t, s, "evt-1", "evt-2", "evt-3", "evt-4")
	if err := s.Settle(context.Background(), []outbox.Outcome{
		{EventID: "evt-1", Kind: outbox.Delivered},
		{EventID: "evt-2", Kind: outbox.Rejected, Error: "conflict: payload differs"},
		{EventID: "evt-3", Kind: outbox.Unanswered, Error: "eof"},
	}); err != nil {
		t.Fatal(err)
	}
	before, err := s.List(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	_, msgs := dueIDs(t, s, clk.Now(), 0, 10)
	lastSeq := msgs[len(msgs)-1].Seq
	closeStore()

	s2, _ := open(t, path, Config{Now: clk.Now})
	after, err := s2.List(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) || len(after) != 3 {
		t.Fatalf("after reopening:\n%+v\nwant\n%+v", after, before)
	}
	wantCounts(t, s2, 2, 1)
	insertOK(t, s2, "evt-5")
	_, msgs = dueIDs(t, s2, clk.Now(), lastSeq, 10)
	if len(msgs) != 1 || msgs[0].EventID != "evt-5" || msgs[0].Seq <= lastSeq {
		t.Fatalf("Due after the old rows = %+v; want evt-5 with a Seq over %d", msgs, lastSeq)
	}
	// The same envelope is still known as a duplicate after the reopen.
	res, err := s2.Insert(context.Background(), []postbox.Envelope{env("evt-3", `{"n":1}`)})
	if err != nil || !res[0].Duplicate {
		t.Fatalf("reinserting evt-3 after the reopen: %+v %v; want Duplicate", res, err)
	}
}

// A producer that resends an event id without ts gets a new ts filled in;
// the payload is the same, so it is the same event: a duplicate.
func TestInsertSamePayloadOtherTSIsDuplicate(t *testing.T) {
	s, done := open(t, filepath.Join(t.TempDir(), "o.db"), Config{})
	defer done()
	first := env("evt_ts", `{"a":1}`)
	again := env("evt_ts", `{ "a" : 1 }`)
	again.TS, again.SessionID = "2031-01-01T00:00:00Z", "sess_other_run"
	for i, e := range []postbox.Envelope{first, again} {
		res, err := s.Insert(context.Background(), []postbox.Envelope{e})
		if err != nil || res[0].Err != nil || res[0].Duplicate != (i == 1) {
			t.Fatalf("insert %d: %+v %v", i, res, err)
		}
	}
	msgs, err := s.Due(context.Background(), time.Now(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].CreatedAt.Format(time.RFC3339Nano) != first.TS || msgs[0].CorrelationID != first.SessionID || string(msgs[0].Body) != `{"a":1}` {
		t.Fatalf("the queued row changed: %+v", msgs)
	}
}

// A service's own SQLite database: the business write and InsertTx commit
// or roll back together, and a Store on the same file relays what
// committed.
func TestInsertTxInTheCallersTransaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "service.db")
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := "order-rolled-back"
		if commit {
			id = "order-committed"
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES (?)`, id); err != nil {
			t.Fatal(err)
		}
		e := outbox.Event{ID: id, Type: "order.created", Payload: json.RawMessage(`{"id":"` + id + `"}`), TenantID: "acme"}
		if err := Insert(ctx, tx, e); err != nil {
			t.Fatal(err)
		}
		if err := Insert(ctx, tx, e); !errors.Is(err, outbox.ErrDuplicate) {
			t.Fatalf("second insert of %s: %v, want ErrDuplicate", id, err)
		}
		if err := Insert(ctx, tx, outbox.Event{Type: "x", Payload: json.RawMessage(`[1]`)}); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "payload") {
			t.Fatalf("insert of an array payload: %v, want ErrInvalidEvent naming payload", err)
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
	s, err := Open(path, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs, err := s.Due(ctx, time.Now(), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 1 || msgs[0].EventID != "order-committed" {
		t.Fatalf("due rows: %+v, want the committed event only", msgs)
	}
	m := msgs[0]
	if m.TenantID != "acme" || m.CorrelationID != "order-committed" || string(m.Body) != `{"id":"order-committed"}` || m.Type != "order.created" {
		t.Fatalf("due message %s: %+v; want the event's payload and fields", m.Body, m)
	}
	if d := time.Since(m.CreatedAt); d < 0 || d > time.Minute {
		t.Fatalf("due message: CreatedAt %v, want the insert's time", m.CreatedAt)
	}
	env := m.Envelope()
	if err := env.Validate(postbox.Limits{}); err != nil || env.DeviceID != "acme" || env.SessionID != "order-committed" {
		t.Fatalf("its envelope %+v: %v", env, err)
	}
}

// TestInsertChunksWithQueuedIDs: rows go in four to a statement; a chunk
// holding an id queued already, or one id twice, still answers each row
// as a single insert would, keeps the queued rows unchanged and queues
// the rest once, in the order given.
func TestInsertChunksWithQueuedIDs(t *testing.T) {
	s, _ := open(t, "", Config{})
	ctx := context.Background()
	insertOK(t, s, "evt-q1", "evt-q2")
	envs := []postbox.Envelope{
		env("evt-1", `{}`), env("evt-2", `{}`), env("evt-q1", `{"n":1}`), env("evt-3", `{}`), // a duplicate
		env("evt-4", `{}`), env("evt-5", `{}`), env("evt-6", `{}`), env("evt-7", `{}`), // new
		env("evt-8", `{}`), env("evt-8", `{}`), env("evt-q2", `{"n":2}`), env("evt-9", `{}`), // an id twice, a conflict
		env("evt-10", `{}`),
	}
	res, err := s.Insert(ctx, envs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		var want string
		switch i {
		case 2, 9:
			want = "duplicate"
		case 10:
			want = "conflict"
		default:
			want = "queued"
		}
		got := "queued"
		if r.Duplicate {
			got = "duplicate"
		}
		if errors.Is(r.Err, ErrConflict) {
			got = "conflict"
		}
		if got != want || r.EventID != envs[i].EventID {
			t.Fatalf("row %d (%s): %+v, want %s", i, envs[i].EventID, r, want)
		}
	}
	ids, _ := dueIDs(t, s, time.Now().Add(time.Hour), 0, 100)
	want := []string{"evt-q1", "evt-q2", "evt-1", "evt-2", "evt-3", "evt-4", "evt-5", "evt-6", "evt-7", "evt-8", "evt-9", "evt-10"}
	if !reflect.DeepEqual(ids, want) {
		t.Fatalf("due: %v, want %v", ids, want)
	}
	if r := list(t, s, "")["evt-q2"]; string(r.Payload) != `{"n":1}` {
		t.Fatalf("evt-q2 after the conflict: %+v; want the first payload", r)
	}
}

// TestSettleEndsWithItsContext: a settle the writer does not answer (here
// one whose Run is not taking writes) returns when its context ends,
// instead of holding up the relay's shutdown.
func TestSettleEndsWithItsContext(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "outbox.db"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.running.Store(true) // as if Run ran, but nothing writes
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = s.Settle(ctx, []outbox.Outcome{{EventID: "evt-1", Kind: outbox.Delivered}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Settle with no writer: %v, want the context's deadline", err)
	}
}

// TestTraceColumnsByChunk: rows without a trace context are inserted
// without the trace columns, rows with one with them, and a chunk that
// mixes both with them; read back from the file, each row has its own.
func TestTraceColumnsByChunk(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, closeStore := open(t, path, Config{Now: clk.Now})
	var envs []postbox.Envelope
	for i := range 10 {
		e := env(fmt.Sprintf("evt-%02d", i), `{"n":1}`)
		switch i {
		case 5: // the second chunk of four mixes both
			e.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		case 9: // in the last chunk, of two, with a tracestate alone
			e.TraceState = "vendor=v1"
		}
		envs = append(envs, e)
	}
	insertNew(t, s, envs...)
	closeStore()
	s2, _ := open(t, path, Config{Now: clk.Now})
	_, msgs := dueIDs(t, s2, clk.Now(), 0, 100)
	if len(msgs) != len(envs) {
		t.Fatalf("Due after reopening: %d messages, want %d", len(msgs), len(envs))
	}
	for i, m := range msgs {
		if m.EventID != envs[i].EventID || m.TraceParent != envs[i].TraceParent || m.TraceState != envs[i].TraceState ||
			m.CorrelationID != "sess-1" || m.TenantID != "dev-1" {
			t.Errorf("message %d: %+v; want %s with traceparent %q, tracestate %q", i, m, envs[i].EventID, envs[i].TraceParent, envs[i].TraceState)
		}
	}
}
