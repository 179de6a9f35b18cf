package delivery_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// scheduleItems writes n pending items of inbox, of the subscription
// whose uid is sub, due at due, at offsets from first on: items as a
// subscription makes them, written by SQL for speed (a million in
// seconds). The kept counts do not count them.
func (e *env) scheduleItems(t testing.TB, inbox, sub string, first, n int64, due time.Time) {
	t.Helper()
	e.writeItems(t, inbox, sub, delivery.StatePending, first, n, due)
}

// writeItems writes n items of inbox in state, as scheduleItems does.
func (e *env) writeItems(t testing.TB, inbox, sub, state string, first, n int64, due time.Time) {
	t.Helper()
	now := e.clock.Now().UTC().Format(sqlitedb.Time)
	at := due.UTC().Format(sqlitedb.Time)
	cols := `INSERT INTO inbox_items (inbox_id, subscription_id, subscription_uid, stream_id, "offset", source_native_id, event_type,
		occurred_at, stored_at, metadata_json, payload_json, next_attempt_at, created_at, updated_at, state)`
	vals := `SELECT $1, $2, $2, 'devices', $3 + i, 'ev-' || ($3 + i), 't', $4, $4, '{"deliver_at":"x"}', '{"n":1}', $5, $4, $4, $7`
	q := `WITH RECURSIVE seq(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < $6) ` + cols + vals + ` FROM seq`
	if e.kind == postgresStore {
		q = cols + vals + ` FROM generate_series(0, $6 - 1) AS i`
	}
	if err := e.state.Update(context.Background(), func(tx *sql.Tx) error {
		_, err := tx.Exec(q, inbox, sub, first, now, at, n, state)
		return err
	}); err != nil {
		t.Fatalf("schedule %d items: %v", n, err)
	}
	if e.kind == postgresStore {
		// As autovacuum would after so many inserts: not while a
		// benchmark measures.
		if _, err := e.state.ReadDB().Exec(`VACUUM ANALYZE inbox_items`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLeasePlanSkipsLaterItems: a lease reads the pending items due now
// through the index of pending items by when they are due
// (inbox_items_due), so that items scheduled for later are not read;
// listing pending items and the oldest one still read the index of
// states, in id order, without a sort. On PostgreSQL, with 20,000 items
// scheduled for tomorrow ahead of the due ones, the lease's plan reads
// inbox_items_due, and so does its time: it takes the due items.
func TestLeasePlanSkipsLaterItems(t *testing.T) { eachStore(t, testLeasePlanSkipsLaterItems) }

func testLeasePlanSkipsLaterItems(t *testing.T, kind storeKind) {
	ctx := context.Background()
	e := setup(t, kind, delivery.Config{})
	now := e.clock.Now()
	e.scheduleItems(t, "s", "sub_s", 1, 20000, now.Add(24*time.Hour))
	e.scheduleItems(t, "s", "sub_s", 20001, 5, now.Add(-time.Minute))
	nowText, expires := now.UTC().Format(sqlitedb.Time), now.Add(time.Hour).UTC().Format(sqlitedb.Time)
	args := []any{"lease_x", expires, nowText, "s", 10, 5}
	explain := func(q string, args ...any) string {
		prefix := `EXPLAIN QUERY PLAN `
		if kind == postgresStore {
			prefix, q = `EXPLAIN `, sqlitedb.Rebind(q)
		}
		rows, err := e.state.ReadDB().Query(prefix+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		var lines []string
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			if s, ok := vals[len(vals)-1].(string); ok {
				lines = append(lines, strings.TrimSpace(s))
			} else if b, ok := vals[len(vals)-1].([]byte); ok {
				lines = append(lines, strings.TrimSpace(string(b)))
			}
		}
		return strings.Join(lines, "; ")
	}
	if kind == sqliteStore {
		p := explain(delivery.LeaseDueSQL, args...)
		t.Logf("lease of due items: %s", p)
		if !strings.Contains(p, "USING INDEX inbox_items_due (inbox_id=? AND next_attempt_at<?)") || strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("lease of due items: plan %q, want a range of inbox_items_due and no sort", p)
		}
		for what, q := range map[string]string{
			"pending items in id order": `SELECT item_id FROM inbox_items WHERE inbox_id = 's' AND state = 'pending' AND item_id > 0 ORDER BY item_id LIMIT 100`,
			"the oldest pending item":   `SELECT created_at FROM inbox_items WHERE inbox_id = 's' AND state = 'pending' ORDER BY item_id LIMIT 1`,
		} {
			if p := explain(q); !strings.Contains(p, "inbox_items_by_state") || strings.Contains(p, "TEMP B-TREE") {
				t.Errorf("%s: plan %q, want inbox_items_by_state without a sort", what, p)
			}
		}
	} else {
		p := explain(delivery.LeasePostgresSQL, args...)
		t.Logf("lease: %s", p)
		if !strings.Contains(p, "inbox_items_due") {
			t.Errorf("lease: plan %q, want inbox_items_due", p)
		}
	}
	l, err := e.d.Lease(ctx, "s", 10, time.Hour, 0)
	if err != nil || len(l.Items) != 5 || l.Items[0].Offset != 20001 {
		t.Fatalf("lease: %d items, %v; want the 5 due ones", len(l.Items), err)
	}
}

// BenchmarkLeaseDue measures a lease of 10 due items from an inbox of
// 1,000 due items, in three stores side by side: one that holds nothing
// else, one that holds a million items of the same inbox scheduled for
// tomorrow ahead of them (lower ids), and, for comparison, one that holds
// a million completed items there: what a lease pays for a bigger table,
// whatever its items wait for. The leases go round the three, so that a
// change of the machine's load meanwhile weighs on each alike; it reports
// each one's time a lease (none-, later-, done-ns/lease) and the ratios
// later/none and done/none. The stores are opened
// again after their items were written, and warmed up by 100 leases. Each
// lease's items go back to pending, timer stopped, every 50 leases.
// SQLite commits with synchronous NORMAL, without waiting for the disk:
// an fsync, the same in both stores, would make most of a lease's time,
// and of its noise on a shared machine. Not run in CI; with
// POSTBOX_TEST_POSTGRES it runs on PostgreSQL too:
//
//	go test ./internal/delivery -run '^$' -bench BenchmarkLeaseDue -benchtime 3000x
func BenchmarkLeaseDue(b *testing.B) {
	for _, kind := range []storeKind{sqliteStore, postgresStore} {
		b.Run(string(kind), func(b *testing.B) {
			ctx := context.Background()
			none, later, done := leaseBench(b, kind, "", 0), leaseBench(b, kind, delivery.StatePending, 1_000_000),
				leaseBench(b, kind, delivery.StateCompleted, 1_000_000)
			var took [3]time.Duration
			b.ResetTimer()
			for i := range b.N {
				if i > 0 && i%50 == 0 {
					b.StopTimer()
					none.back()
					later.back()
					done.back()
					b.StartTimer()
				}
				for j, lb := range [3]*leaseBenchStore{none, later, done} {
					start := time.Now()
					l, err := lb.e.d.Lease(ctx, "s", 10, time.Hour, 0)
					took[j] += time.Since(start)
					if err != nil || len(l.Items) != 10 {
						b.Fatalf("lease: %d items, %v", len(l.Items), err)
					}
				}
			}
			b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "none-ns/lease")
			b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "later-ns/lease")
			b.ReportMetric(float64(took[2].Nanoseconds())/float64(b.N), "done-ns/lease")
			b.ReportMetric(float64(took[1])/float64(took[0]), "later/none")
			b.ReportMetric(float64(took[2])/float64(took[0]), "done/none")
		})
	}
}

// leaseBenchStore is one store of BenchmarkLeaseDue.
type leaseBenchStore struct {
	e    *env
	back func() // returns the leased items to pending
}

// leaseBench opens a store of kind holding 1,000 due items of the inbox
// s behind n items in state (pending ones are due tomorrow), opened again
// after they were written (the close checkpoints them into SQLite's
// database file, which the checkpointer would do during the leases
// measured) and warmed up by 100 leases.
func leaseBench(b *testing.B, kind storeKind, state string, n int64) *leaseBenchStore {
	b.Helper()
	ctx := context.Background()
	cfg := delivery.Config{Retention: -1, ReapInterval: time.Hour}
	streamsAt := filepath.Join(b.TempDir(), "p.db")
	e := open(b, kind, openOptions{streams: streamsAt, cfg: cfg, sync: sqlitedb.SyncNormal})
	now := e.clock.Now()
	if n > 0 {
		e.writeItems(b, "s", "sub_s", state, 1, n, now.Add(24*time.Hour))
	}
	e.scheduleItems(b, "s", "sub_s", n+1, 1000, now.Add(-time.Minute))
	stateAt := e.stateAt
	e.stop()
	e = open(b, kind, openOptions{streams: streamsAt, state: stateAt, cfg: cfg, sync: sqlitedb.SyncNormal})
	e.clock.Advance(now.Sub(e.clock.Now()))
	lb := &leaseBenchStore{e: e, back: func() {
		e.exec(b, `UPDATE inbox_items SET state = 'pending', lease_token = NULL, lease_expires_at = NULL, attempts = 0 WHERE state = 'processing'`)
	}}
	for i := range 100 {
		if i%50 == 0 {
			lb.back()
		}
		if _, err := e.d.Lease(ctx, "s", 10, time.Hour, 0); err != nil {
			b.Fatal(err)
		}
	}
	lb.back()
	return lb
}
