package intakerate

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-events/postbox/internal/testenv"
)

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock               { return &clock{t: time.Unix(1_700_000_000, 0)} }
func takeOne(t *testing.T, l *Limiter, key string, r Rate) (bool, time.Duration) {
	t.Helper()
	ok, wait, err := l.Take(context.Background(), key, r, 1)
	if err != nil {
		t.Fatal(err)
	}
	return ok, wait
}

// TestMemoryBucket: 100/s burst 100 takes 100 at once, refuses the 101st
// saying when the next is there, and refills at the rate.
func TestMemoryBucket(t *testing.T) {
	c := newClock()
	l := NewMemory()
	l.now = c.now
	r := Rate{PerSecond: 100, Burst: 100}
	for i := range 100 {
		if ok, _ := takeOne(t, l, "source:a", r); !ok {
			t.Fatalf("take %d refused within the burst", i+1)
		}
	}
	ok, wait := takeOne(t, l, "source:a", r)
	if ok || wait != 10*time.Millisecond {
		t.Fatalf("101st: ok %v wait %v, want refused for 10ms", ok, wait)
	}
	if ok, _ := takeOne(t, l, "source:b", r); !ok {
		t.Fatal("another key shares the bucket")
	}
	c.add(wait)
	if ok, _ := takeOne(t, l, "source:a", r); !ok {
		t.Fatal("refused after the wait it was told")
	}
	c.add(10 * time.Second) // refills to the burst, not beyond
	n := 0
	for {
		if ok, _ := takeOne(t, l, "source:a", r); !ok {
			break
		}
		n++
	}
	if n != 100 {
		t.Fatalf("after a quiet spell took %d, want the burst 100", n)
	}
}

// TestWaitSplitsOverBurst: Wait takes more than the burst in pieces.
func TestWaitSplitsOverBurst(t *testing.T) {
	l := NewMemory()
	start := time.Now()
	waited, err := l.Wait(context.Background(), "device:d", Rate{PerSecond: 100, Burst: 10}, 30)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 150*time.Millisecond || waited < 150*time.Millisecond {
		t.Fatalf("30 events at 100/s burst 10 took %v (waited %v), want about 200ms", took, waited)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := l.Wait(ctx, "device:e", Rate{PerSecond: 1, Burst: 1}, 3); err == nil {
		t.Fatal("Wait did not end with its context")
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		r    Rate
		want string
	}{
		{Rate{PerSecond: 0}, "settings.rate_limit.per_second 0"},
		{Rate{PerSecond: -1}, "per_second -1"},
		{Rate{PerSecond: 2e6}, "per_second"},
		{Rate{PerSecond: 1, Burst: -1}, "settings.rate_limit.burst -1"},
	} {
		err := c.r.Validate("settings.rate_limit")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %q", c.r, err, c.want)
		}
	}
	if err := (Rate{PerSecond: 0.5}).Validate("x"); err != nil {
		t.Fatal(err)
	}
	if b := (Rate{PerSecond: 0.5}).EffectiveBurst(); b != 1 {
		t.Fatalf("burst of 0.5/s: %d, want 1", b)
	}
}

// pgDB runs each Update in a transaction of a database/sql pool.
type pgDB struct{ db *sql.DB }

func (p pgDB) Update(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestSharedBucket: two limiters (two nodes) on one PostgreSQL row admit
// together at most the burst plus the rate over the time they ran, plus
// a batch each, and the row refills.
func TestSharedBucket(t *testing.T) {
	u := testenv.PostgresSchema(t)
	db, err := sql.Open("pgx", u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b, err := os.ReadFile("../intake/pgmigrations/0002_intake_rates.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(string(b)); err != nil {
		t.Fatal(err)
	}
	r := Rate{PerSecond: 100, Burst: 100}
	nodes := []*Limiter{NewShared(pgDB{db}), NewShared(pgDB{db})}
	start := time.Now()
	var admitted int
	var refused [2]int
	for time.Since(start) < 300*time.Millisecond {
		for i, l := range nodes {
			ok, wait, err := l.Take(context.Background(), "source:shared", r, 1)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				admitted++
			} else {
				refused[i]++
				if wait <= 0 || wait > time.Second {
					t.Fatalf("refused with wait %v", wait)
				}
			}
		}
	}
	took := time.Since(start).Seconds()
	bound := 100 + 100*took + 2*10
	if float64(admitted) > bound || admitted < 100 {
		t.Fatalf("two nodes admitted %d in %.2fs, want 100 to %.0f", admitted, took, bound)
	}
	if refused[0] == 0 || refused[1] == 0 {
		t.Fatalf("refused %v: each node should have met the shared limit", refused)
	}
	t.Logf("two nodes admitted %d in %.2fs (bound %.0f), refused %v", admitted, took, bound, refused)
}
