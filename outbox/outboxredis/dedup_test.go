package outboxredis_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
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
	"github.com/postbox-events/postbox/outbox/outboxredis"
)

// openPostgres returns a pool on a schema of the test's own, dropped when
// it ends.
func openPostgres(t testing.TB) *sql.DB {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(testenv.URL(t, testenv.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	schema := "outboxredis_test_" + strings.ToLower(rand.Text()[:12])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Copy()
	cfg.RuntimeParams["search_path"] = schema
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() {
		db.Close()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		admin.Close(ctx)
	})
	return db
}

// The stream holds every event twice (the relay lost its ACKs and sent
// them again), three consumers of one group handle them concurrently, and
// some handlers fail after their transaction committed (as if the process
// died before its XACK), so those entries are delivered again too. A
// handler that applies its effect through dedup.Handle applies each event
// exactly once.
func TestConsumersWithDedupApplyEachEventOnce(t *testing.T) {
	for _, engine := range []string{"sqlite", "postgres"} {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			c := newClient(t)
			stream := newStream(t, c)
			var db *sql.DB
			ddl := `CREATE TABLE ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, amount INTEGER NOT NULL)`
			if engine == "sqlite" {
				var err error
				if db, err = sqlitedb.Open(filepath.Join(t.TempDir(), "app.db"), sqlitedb.Options{MaxConns: 8}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
			} else {
				db = openPostgres(t)
				ddl = `CREATE TABLE ledger (seq BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL, amount INTEGER NOT NULL)`
			}
			if err := dedup.Migrate(ctx, db); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, ddl); err != nil {
				t.Fatal(err)
			}

			const n = 200
			msgs := messages("credit", n)
			p := newPublisher(t, c, outboxredis.Config{Stream: stream})
			publish(t, p, msgs[:120]) // sent, ACK lost,
			publish(t, p, msgs[:120]) // sent again,
			publish(t, p, msgs[120:]) // and so on
			publish(t, p, msgs[100:])
			publish(t, p, msgs[:100])
			entries := int64(120 + 120 + 80 + 100 + 100)
			if l, _ := c.XLen(ctx, stream).Result(); l != entries {
				t.Fatalf("XLEN %d, want %d", l, entries)
			}

			var (
				lostAck   sync.Map // event id → its first commit's ACK was "lost"
				succeeded atomic.Int64
				applied   atomic.Int64
			)
			handler := func(ctx context.Context, m outboxredis.Message) error {
				ran, err := dedup.Handle(ctx, db, "ledger", m.EventID, func(tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO ledger (event_id, amount) VALUES ($1, $2)`, m.EventID, 10)
					return err
				})
				if err != nil {
					return err
				}
				if ran {
					applied.Add(1)
					if strings.HasSuffix(m.EventID, "7") {
						if _, dup := lostAck.LoadOrStore(m.EventID, true); !dup {
							return errors.New("the process died before its XACK")
						}
					}
				}
				succeeded.Add(1)
				return nil
			}
			for i := range 3 {
				runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{
					Stream: stream, Group: "ledger", Consumer: fmt.Sprint("worker-", i),
					Batch: 16, MinIdle: 100 * time.Millisecond, Handler: handler,
				}))
			}
			last, err := c.XRevRangeN(ctx, stream, "+", "-", 1).Result()
			if err != nil {
				t.Fatal(err)
			}
			// Done when the group has read the whole stream and has nothing
			// pending. (Entries may be handled more than once: a handler
			// slowed by SQLite's locking can run past MinIdle, and another
			// consumer claims its entry. That is what dedup is for.)
			testenv.Eventually(t, 30*time.Second, "every entry handled and acknowledged", func() bool {
				groups, err := c.XInfoGroups(ctx, stream).Result()
				if err != nil {
					t.Fatal(err)
				}
				return len(groups) == 1 && groups[0].LastDeliveredID == last[0].ID && groups[0].Pending == 0
			})
			if got := succeeded.Load(); got < entries {
				t.Fatalf("%d entries handled, want at least %d", got, entries)
			}

			var rows, distinct, total int64
			if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT event_id), coalesce(sum(amount), 0) FROM ledger`).Scan(&rows, &distinct, &total); err != nil {
				t.Fatal(err)
			}
			if rows != n || distinct != n || total != 10*n || applied.Load() != n {
				t.Fatalf("ledger: %d rows, %d events, total %d, %d applied; want each of %d events once", rows, distinct, total, applied.Load(), n)
			}
			if dead, _ := c.XLen(ctx, stream+outboxredis.DeadStreamSuffix).Result(); dead != 0 {
				t.Fatalf("%d dead letters", dead)
			}
		})
	}
}
