package dedup_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/postbox-events/postbox/dedup"
)

// BenchmarkHandle measures what dedup adds to a handler's transaction (the
// target: at most 1 ms at p99 on PostgreSQL). "plain" is the handler's own
// transaction (BEGIN; INSERT a row into a business table; COMMIT); "dedup"
// is the same inside Handle (database/sql) or HandlePgx, with a new id
// every time, so that every operation records one. Each iteration runs one
// of each, in alternating order, so that load from elsewhere on the machine
// falls on both alike; ns/op is therefore the time of the pair. It reports
// each kind's latency at p50 and p99 and the p99 difference, in µs.
//
//	go test -run '^$' -bench Handle -benchtime 5000x -count 3 ./dedup/
func BenchmarkHandle(b *testing.B) {
	ctx := context.Background()
	db, cfg := openPostgres(b)
	migrate(b, db)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	lite := openSQLite(b)
	migrate(b, lite)

	seq := 0
	const insert = `INSERT INTO effects (handler, id) VALUES ($1, $2)`
	sqlPlain := func(db *sql.DB) func(id string) error {
		return func(id string) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := effect(ctx, tx, "bench", id); err != nil {
				return err
			}
			return tx.Commit()
		}
	}
	sqlDedup := func(db *sql.DB) func(id string) error {
		return func(id string) error {
			_, err := dedup.Handle(ctx, db, "bench", id, func(tx *sql.Tx) error {
				return effect(ctx, tx, "bench", id)
			})
			return err
		}
	}
	pgxPlain := func(id string) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, "bench", id)
			return err
		})
	}
	pgxDedup := func(id string) error {
		_, err := dedup.HandlePgx(ctx, conn, "bench", id, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, "bench", id)
			return err
		})
		return err
	}
	for _, c := range []struct {
		name         string
		plain, dedup func(id string) error
	}{
		{"postgres/sql", sqlPlain(db), sqlDedup(db)},
		{"postgres/pgx", pgxPlain, pgxDedup},
		{"sqlite/sql", sqlPlain(lite), sqlDedup(lite)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var plain, dedup []time.Duration
			timed := func(op func(string) error, lat *[]time.Duration) {
				// -count runs a sub-benchmark again on the same tables:
				// a repeated id would measure a skipped duplicate.
				seq++
				id := fmt.Sprintf("evt_%d", seq)
				start := time.Now()
				if err := op(id); err != nil {
					b.Fatal(err)
				}
				*lat = append(*lat, time.Since(start))
			}
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					timed(c.plain, &plain)
					timed(c.dedup, &dedup)
				} else {
					timed(c.dedup, &dedup)
					timed(c.plain, &plain)
				}
			}
			p50, p99 := percentile(plain, 0.50), percentile(plain, 0.99)
			d50, d99 := percentile(dedup, 0.50), percentile(dedup, 0.99)
			b.ReportMetric(p50, "plain-p50-µs")
			b.ReportMetric(p99, "plain-p99-µs")
			b.ReportMetric(d50, "dedup-p50-µs")
			b.ReportMetric(d99, "dedup-p99-µs")
			b.ReportMetric(d99-p99, "p99-overhead-µs")
		})
	}
}

// percentile returns the q-quantile of lat in µs, sorting lat.
func percentile(lat []time.Duration, q float64) float64 {
	slices.Sort(lat)
	return float64(lat[int(q*float64(len(lat)-1))].Nanoseconds()) / 1e3
}
