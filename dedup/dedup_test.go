package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/postbox-events/postbox/dedup"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// pgConfig returns a connection config for a fresh schema of the test
// database (testenv.PostgresSchema), with application_name set to the
// schema's name so that a test can find its own sessions in
// pg_stat_activity.
func pgConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = cfg.RuntimeParams["search_path"]
	return cfg
}

// openPostgres returns a database/sql pool on a fresh schema, without the
// inbox table.
func openPostgres(t testing.TB) (*sql.DB, *pgx.ConnConfig) {
	t.Helper()
	cfg := pgConfig(t)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return db, cfg
}

// openSQLite returns a pool of several connections on a new SQLite file,
// without the inbox table, so that concurrent deliveries meet in SQLite's
// own locking rather than queueing for one connection.
func openSQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqlitedb.Open(filepath.Join(t.TempDir(), "dedup.db"), sqlitedb.Options{MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// eachDB runs test on SQLite and on PostgreSQL, each with a migrated inbox
// and an empty effects table: the business table handlers write to.
func eachDB(t *testing.T, test func(t *testing.T, db *sql.DB)) {
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var db *sql.DB
			if name == "sqlite" {
				db = openSQLite(t)
			} else {
				db, _ = openPostgres(t)
			}
			migrate(t, db)
			test(t, db)
		})
	}
}

func migrate(t testing.TB, db *sql.DB) {
	t.Helper()
	if err := dedup.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (handler TEXT NOT NULL, id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// effect is a handler's business write.
func effect(ctx context.Context, tx *sql.Tx, handler, id string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (handler, id) VALUES ($1, $2)`, handler, id)
	return err
}

func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// wantRows checks how many effects and inbox records (id, handler) has.
func wantRows(t testing.TB, db *sql.DB, handler, id string, want int) {
	t.Helper()
	e := count(t, db, `SELECT count(*) FROM effects WHERE handler = $1 AND id = $2`, handler, id)
	r := count(t, db, `SELECT count(*) FROM inbox WHERE handler_name = $1 AND id = $2`, handler, id)
	if e != want || r != want {
		t.Fatalf("%s/%s: %d effects and %d inbox records, want %d of each", handler, id, e, r, want)
	}
}

// TestDuplicateIsNoop: the second and later deliveries of an id do not call
// the handler and leave one effect.
func TestDuplicateIsNoop(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		calls := 0
		for i := range 3 {
			ran, err := dedup.Handle(ctx, db, "ledger", "evt_01JD5X", func(tx *sql.Tx) error {
				calls++
				return effect(ctx, tx, "ledger", "evt_01JD5X")
			})
			if err != nil || ran != (i == 0) {
				t.Fatalf("delivery %d: ran %v, %v; want %v, nil", i+1, ran, err, i == 0)
			}
		}
		if calls != 1 {
			t.Fatalf("handler called %d times, want 1", calls)
		}
		wantRows(t, db, "ledger", "evt_01JD5X", 1)
	})
}

// TestErrorRollsBack: a failing handler leaves neither its write nor the
// record, and the next delivery runs it again.
func TestErrorRollsBack(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		boom := errors.New("downstream refused")
		ran, err := dedup.Handle(ctx, db, "ledger", "evt_1", func(tx *sql.Tx) error {
			if err := effect(ctx, tx, "ledger", "evt_1"); err != nil {
				return err
			}
			return boom
		})
		if ran || err != boom {
			t.Fatalf("failing handler: ran %v, err %v; want false, the handler's own error", ran, err)
		}
		wantRows(t, db, "ledger", "evt_1", 0)

		ran, err = dedup.Handle(ctx, db, "ledger", "evt_1", func(tx *sql.Tx) error {
			return effect(ctx, tx, "ledger", "evt_1")
		})
		if !ran || err != nil {
			t.Fatalf("redelivery after a failure: ran %v, %v; want true, nil", ran, err)
		}
		wantRows(t, db, "ledger", "evt_1", 1)
	})
}

// TestPanicRollsBack: a panicking handler's write and record are rolled
// back, the panic reaches the caller, and the connection is usable again.
func TestPanicRollsBack(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		func() {
			defer func() {
				if r := recover(); r != "handler bug" {
					t.Fatalf("recovered %v, want the handler's panic", r)
				}
			}()
			dedup.Handle(ctx, db, "ledger", "evt_1", func(tx *sql.Tx) error {
				if err := effect(ctx, tx, "ledger", "evt_1"); err != nil {
					return err
				}
				panic("handler bug")
			})
		}()
		wantRows(t, db, "ledger", "evt_1", 0)
		ran, err := dedup.Handle(ctx, db, "ledger", "evt_1", func(tx *sql.Tx) error {
			return effect(ctx, tx, "ledger", "evt_1")
		})
		if !ran || err != nil {
			t.Fatalf("redelivery after a panic: ran %v, %v; want true, nil", ran, err)
		}
		wantRows(t, db, "ledger", "evt_1", 1)
	})
}

// TestHandlersAreIndependent: each handler handles an id once, whatever the
// others did.
func TestHandlersAreIndependent(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		for round := range 2 {
			for _, h := range []string{"ledger", "rewards"} {
				ran, err := dedup.Handle(ctx, db, h, "evt_1", func(tx *sql.Tx) error {
					return effect(ctx, tx, h, "evt_1")
				})
				if err != nil || ran != (round == 0) {
					t.Fatalf("round %d, %s: ran %v, %v", round, h, ran, err)
				}
			}
		}
		wantRows(t, db, "ledger", "evt_1", 1)
		wantRows(t, db, "rewards", "evt_1", 1)
	})
}

// TestConcurrentDeliveries: many deliveries of one id at once run the
// handler exactly once. On PostgreSQL the handler that runs holds its
// transaction open until every other delivery is waiting on its inbox row,
// so the deliveries really do overlap.
func TestConcurrentDeliveries(t *testing.T) {
	const n = 16
	ctx := context.Background()
	for _, name := range []string{"sqlite", "sqlite-deferred", "postgres", "pgx"} {
		t.Run(name, func(t *testing.T) {
			var (
				db  *sql.DB
				cfg *pgx.ConnConfig
			)
			switch name {
			case "sqlite":
				db = openSQLite(t)
			case "sqlite-deferred":
				// As Handle's doc asks of a SQLite db opened by hand: a
				// busy timeout, but BEGIN DEFERRED rather than sqlitedb's
				// BEGIN IMMEDIATE.
				var err error
				db, err = sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "d.db")+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			default:
				db, cfg = openPostgres(t)
			}
			migrate(t, db)
			var calls atomic.Int32
			// othersWaiting returns when the n-1 other deliveries wait on
			// the inbox row lock held by the one that runs.
			othersWaiting := func() {
				if cfg == nil {
					return // SQLite's waiters sleep in its busy handler, out of sight
				}
				deadline := time.Now().Add(20 * time.Second)
				for {
					var waiting int
					err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
						WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO inbox%'`,
						cfg.RuntimeParams["application_name"]).Scan(&waiting)
					if err != nil {
						t.Error(err)
						return
					}
					if waiting == n-1 {
						return
					}
					if time.Now().After(deadline) {
						t.Errorf("only %d of %d other deliveries are waiting on the inbox row", waiting, n-1)
						return
					}
				}
			}
			deliver := func() (bool, error) {
				if name != "pgx" {
					return dedup.Handle(ctx, db, "ledger", "evt_1", func(tx *sql.Tx) error {
						calls.Add(1)
						othersWaiting()
						return effect(ctx, tx, "ledger", "evt_1")
					})
				}
				conn, err := pgx.ConnectConfig(ctx, cfg)
				if err != nil {
					return false, err
				}
				defer conn.Close(ctx)
				return dedup.HandlePgx(ctx, conn, "ledger", "evt_1", func(tx pgx.Tx) error {
					calls.Add(1)
					othersWaiting()
					_, err := tx.Exec(ctx, `INSERT INTO effects (handler, id) VALUES ($1, $2)`, "ledger", "evt_1")
					return err
				})
			}
			start := make(chan struct{})
			var wg sync.WaitGroup
			var ran atomic.Int32
			for range n {
				wg.Go(func() {
					<-start
					r, err := deliver()
					if err != nil {
						t.Error(err)
					}
					if r {
						ran.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			if calls.Load() != 1 || ran.Load() != 1 {
				t.Fatalf("%d deliveries: handler called %d times, %d reported it ran; want 1 and 1", n, calls.Load(), ran.Load())
			}
			wantRows(t, db, "ledger", "evt_1", 1)
		})
	}
}

// TestCommand: the orchestrator starts one workflow per
// command_id however often the API retries the dispatch; another command
// starts another.
func TestCommand(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		if _, err := db.Exec(`CREATE TABLE workflows (command_id TEXT PRIMARY KEY, kind TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		dispatch := func(commandID string) bool {
			ran, err := dedup.Handle(ctx, db, "worker_orchestrator", commandID, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO workflows (command_id, kind) VALUES ($1, $2)`, commandID, "render_asset")
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			return ran
		}
		first, second := "6f1c2a9e-3b7d-4c2e-9f00-5a1b2c3d4e5f", "0b7e8c1d-2a3f-4e5d-8c9b-a0b1c2d3e4f5"
		if !dispatch(first) || dispatch(first) || dispatch(first) {
			t.Fatal("a retried dispatch started the workflow again, or the first did not start it")
		}
		if !dispatch(second) {
			t.Fatal("another command did not start its workflow")
		}
		if n := count(t, db, `SELECT count(*) FROM workflows`); n != 2 {
			t.Fatalf("%d workflows, want 2", n)
		}
	})
}

// TestForget: Forget deletes the records older than its time and no
// others, and a forgotten id is handled again.
func TestForget(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		for _, id := range []string{"evt_old", "evt_new"} {
			if _, err := dedup.Handle(ctx, db, "ledger", id, func(*sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
		}
		// Backdate one record, in each database's own time type.
		old := time.Now().Add(-48 * time.Hour)
		var arg any = old
		if strings.HasSuffix(t.Name(), "/sqlite") {
			arg = old.UTC().Format("2006-01-02T15:04:05.000Z")
		}
		if _, err := db.Exec(`UPDATE inbox SET processed_at = $1 WHERE id = 'evt_old'`, arg); err != nil {
			t.Fatal(err)
		}
		n, err := dedup.Forget(ctx, db, time.Now().Add(-24*time.Hour))
		if err != nil || n != 1 {
			t.Fatalf("Forget a day back: %d, %v; want 1, nil", n, err)
		}
		if c := count(t, db, `SELECT count(*) FROM inbox WHERE id = 'evt_new'`); c != 1 {
			t.Fatal("Forget deleted a record newer than its time")
		}
		for id, want := range map[string]bool{"evt_old": true, "evt_new": false} {
			ran, err := dedup.Handle(ctx, db, "ledger", id, func(*sql.Tx) error { return nil })
			if err != nil || ran != want {
				t.Fatalf("%s after Forget: ran %v, %v; want %v", id, ran, err, want)
			}
		}
		if n, err := dedup.Forget(ctx, db, time.Now().Add(time.Minute)); err != nil || n != 2 {
			t.Fatalf("Forget everything: %d, %v; want 2", n, err)
		}
	})
}

// TestInvalidKey: an empty, oversized or non-text handler or id is refused
// before anything is written.
func TestInvalidKey(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sql.DB) {
		ctx := context.Background()
		long := strings.Repeat("k", dedup.MaxKeyBytes+1)
		for _, k := range []struct{ handler, id, want string }{
			{"", "evt_1", "handler is empty"},
			{"ledger", "", "id is empty"},
			{long, "evt_1", "handler is 256 bytes"},
			{"ledger", long, "id is 256 bytes"},
			{"ledger", "evt\x00", "id is not UTF-8"},
			{"led\xffger", "evt_1", "handler is not UTF-8"},
		} {
			_, err := dedup.Handle(ctx, db, k.handler, k.id, func(*sql.Tx) error {
				t.Errorf("%q/%q: handler called", k.handler, k.id)
				return nil
			})
			if !errors.Is(err, dedup.ErrInvalidKey) || !strings.Contains(err.Error(), k.want) {
				t.Errorf("%q/%q: %v; want ErrInvalidKey saying %q", k.handler, k.id, err, k.want)
			}
		}
		// The longest key is accepted.
		max := strings.Repeat("k", dedup.MaxKeyBytes)
		if ran, err := dedup.Handle(ctx, db, max, max, func(*sql.Tx) error { return nil }); !ran || err != nil {
			t.Fatalf("longest key: %v, %v", ran, err)
		}
		if n := count(t, db, `SELECT count(*) FROM inbox`); n != 1 {
			t.Fatalf("%d inbox records, want only the longest key's", n)
		}
	})
}

// TestMigrate: migrating again, or from several processes at once, works
// and keeps the records.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"sqlite", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var db *sql.DB
			if name == "sqlite" {
				db = openSQLite(t)
			} else {
				db, _ = openPostgres(t)
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					if err := dedup.Migrate(ctx, db); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if _, err := dedup.Handle(ctx, db, "ledger", "evt_1", func(*sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := dedup.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			if ran, err := dedup.Handle(ctx, db, "ledger", "evt_1", func(*sql.Tx) error { return nil }); ran || err != nil {
				t.Fatalf("after a second Migrate: ran %v, %v; the record was lost", ran, err)
			}
		})
	}
}

// TestPgx: HandlePgx and ForgetPgx on a pgx connection, and HandlePgx inside
// the caller's own pgx transaction, whose rollback takes the record with it.
func TestPgx(t *testing.T) {
	ctx := context.Background()
	db, cfg := openPostgres(t)
	migrate(t, db)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	handle := func(b dedup.Beginner, fail error) (bool, error) {
		return dedup.HandlePgx(ctx, b, "ledger", "evt_1", func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (handler, id) VALUES ('ledger', 'evt_1')`); err != nil {
				return err
			}
			return fail
		})
	}
	boom := errors.New("boom")
	if ran, err := handle(conn, boom); ran || err != boom {
		t.Fatalf("failing handler: %v, %v", ran, err)
	}
	wantRows(t, db, "ledger", "evt_1", 0)

	outer, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ran, err := handle(outer, nil); !ran || err != nil {
		t.Fatalf("in a savepoint: %v, %v", ran, err)
	}
	if err := outer.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantRows(t, db, "ledger", "evt_1", 0)

	for i := range 2 {
		if ran, err := handle(conn, nil); ran != (i == 0) || err != nil {
			t.Fatalf("delivery %d: %v, %v", i+1, ran, err)
		}
	}
	wantRows(t, db, "ledger", "evt_1", 1)
	if _, err := dedup.HandlePgx(ctx, conn, "ledger", "", nil); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("empty id: %v", err)
	}
	if n, err := dedup.ForgetPgx(ctx, conn, time.Now().Add(-time.Hour)); n != 0 || err != nil {
		t.Fatalf("ForgetPgx an hour back: %d, %v", n, err)
	}
	if n, err := dedup.ForgetPgx(ctx, conn, time.Now().Add(time.Minute)); n != 1 || err != nil {
		t.Fatalf("ForgetPgx everything: %d, %v", n, err)
	}
}

// TestMigrateWhileMigrating: on PostgreSQL, a Migrate that starts while
// another service's migration has created the table but not committed
// waits for it and succeeds (without the lock it fails on a duplicate key
// in pg_type).
func TestMigrateWhileMigrating(t *testing.T) {
	ctx := context.Background()
	db, cfg := openPostgres(t)
	other, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, dedup.PostgresSchema); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dedup.Migrate(ctx, db) }()
	deadline := time.Now().Add(20 * time.Second)
	for waiting := 0; waiting == 0; {
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, cfg.RuntimeParams["application_name"]).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("Migrate did not wait for the migration in progress")
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Migrate during another migration: %v", err)
	}
}
