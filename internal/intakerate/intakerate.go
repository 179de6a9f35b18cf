// Package intakerate limits the rate of intake: the webhooks a source
// takes (a source's rate_limit) and the events one device token sends
// through the ingress (serve's --token-rate-limit). Each limit is a token
// bucket per key: Rate.PerSecond tokens a second, up to Rate.Burst.
//
// One process (the SQLite default) keeps its buckets in memory. With a
// shared store (PostgreSQL) every node takes webhooks and device
// connections, so each bucket is one row of intake_rates, refilled by the
// store's clock, like the endpoint rates of delivery (internal/delivery,
// limits.go): a node takes a tenth of a second's worth of tokens (at least
// 1) per statement and spends them from memory, so the row is written
// about ten times a second per busy node whatever the rate. Tokens a node
// took and did not spend within localTTL are dropped, never given back:
// over any window the nodes together admit at most the burst plus the
// rate times the window (tokens taken from the row), and never more than
// one batch per node beyond what the row gave out in the window. A node
// that found the row empty does not ask again until the next token can be
// there.
package intakerate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// Rate is a limit: PerSecond tokens a second, up to Burst at once.
type Rate struct {
	PerSecond float64 `json:"per_second"`
	// Burst is how many may come at once after a quiet spell; 0: one
	// second's worth (at least 1).
	Burst int `json:"burst,omitempty"`
}

// Bounds of a Rate.
const (
	MaxPerSecond = 1_000_000
	MaxBurst     = 10_000_000
)

// IsZero reports whether r is no limit.
func (r Rate) IsZero() bool { return r.PerSecond <= 0 }

// EffectiveBurst is the bucket's size: Burst, or one second's worth (at
// least 1).
func (r Rate) EffectiveBurst() int {
	if r.Burst > 0 {
		return r.Burst
	}
	return max(1, int(math.Ceil(r.PerSecond)))
}

// Validate checks r, naming field (e.g. "settings.rate_limit") in its
// errors.
func (r Rate) Validate(field string) error {
	switch {
	case math.IsNaN(r.PerSecond) || r.PerSecond <= 0 || r.PerSecond > MaxPerSecond:
		return fmt.Errorf("%s.per_second %v: want events per second above 0 and at most %d, e.g. 100", field, r.PerSecond, MaxPerSecond)
	case r.Burst < 0 || r.Burst > MaxBurst:
		return fmt.Errorf("%s.burst %d: want 0 (one second's worth) to %d events", field, r.Burst, MaxBurst)
	}
	return nil
}

// String is r as the docs write it: "100/s burst 100".
func (r Rate) String() string {
	return fmt.Sprintf("%s/s burst %d", formatFloat(r.PerSecond), r.EffectiveBurst())
}

func formatFloat(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%g", f)
}

// DB is the shared store's database: a transaction runs one statement.
type DB interface {
	Update(ctx context.Context, fn func(tx *sql.Tx) error) error
}

const (
	// trip is the least of the rate a node takes per statement (when it
	// wants as many): a tenth of a second's worth.
	trip = 100 * time.Millisecond
	// localTTL is how long a node keeps tokens it took from the store
	// and did not spend.
	localTTL = time.Second
	// retryAfterError is how long a caller waits when the store failed.
	retryAfterError = time.Second
)

// Limiter keeps the buckets: in memory, or in a shared store.
type Limiter struct {
	db  DB // nil: in memory
	now func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

// bucket is a key's bucket in memory, or, with a shared store, the
// tokens this node took from the store's and has not spent.
type bucket struct {
	mu     sync.Mutex
	tokens float64
	at     time.Time // refilled to then (memory); taken then (shared)
	rate   Rate
	empty  time.Time // shared: the store's bucket has no token before then
	used   time.Time
}

// NewMemory returns a limiter keeping its buckets in memory: for one
// process.
func NewMemory() *Limiter { return &Limiter{now: time.Now, buckets: map[string]*bucket{}} }

// NewShared returns a limiter keeping its buckets in db's intake_rates
// (PostgreSQL; intake's migrations create it), shared by every node.
func NewShared(db DB) *Limiter {
	return &Limiter{db: db, now: time.Now, buckets: map[string]*bucket{}}
}

// maxIdle is how long a bucket unused stays in memory: a full one is
// dropped after it, as it would be full again anyway.
const maxIdle = 10 * time.Minute

func (l *Limiter) bucket(key string, now time.Time) *bucket {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= 1024 {
			for k, o := range l.buckets {
				if o.mu.TryLock() {
					idle := now.Sub(o.used) > maxIdle
					o.mu.Unlock()
					if idle {
						delete(l.buckets, k)
					}
				}
			}
		}
		b = &bucket{}
		l.buckets[key] = b
	}
	return b
}

// Take takes n tokens (at most r's burst) of key's bucket at rate r now,
// or none. When it takes none it says how long until n can be there.
// Its error is the shared store's; the caller then refuses for wait.
func (l *Limiter) Take(ctx context.Context, key string, r Rate, n int) (ok bool, wait time.Duration, err error) {
	if r.IsZero() || n <= 0 {
		return true, 0, nil
	}
	burst := float64(r.EffectiveBurst())
	need := min(float64(n), burst)
	now := l.now()
	b := l.bucket(key, now)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used = now
	if b.rate != r { // a new limit: its bucket starts full (or the store's row caps it)
		b.rate, b.tokens, b.at, b.empty = r, burst, now, time.Time{}
		if l.db != nil {
			b.tokens = 0
		}
	}
	if l.db == nil {
		b.tokens = min(burst, b.tokens+now.Sub(b.at).Seconds()*r.PerSecond)
		b.at = now
		if b.tokens >= need {
			b.tokens -= need
			return true, 0, nil
		}
		return false, secondsFor(need-b.tokens, r.PerSecond), nil
	}
	if now.Sub(b.at) > localTTL {
		b.tokens = 0
	}
	if b.tokens >= need {
		b.tokens -= need
		return true, 0, nil
	}
	if now.Before(b.empty) {
		return false, b.empty.Sub(now), nil
	}
	batch := max(need-b.tokens, min(burst, max(1, math.Floor(r.PerSecond*trip.Seconds()))))
	got, avail, err := l.takeShared(ctx, key, burst, r.PerSecond, batch, need-b.tokens)
	if err != nil {
		return false, retryAfterError, err
	}
	if got == 0 {
		wait = secondsFor(need-b.tokens-avail, r.PerSecond)
		b.empty = now.Add(wait)
		return false, wait, nil
	}
	b.tokens += got - need
	b.at = now
	return true, 0, nil
}

// secondsFor is how long k tokens take to come at perSecond, at least a
// millisecond.
func secondsFor(k, perSecond float64) time.Duration {
	return max(time.Duration(k/perSecond*float64(time.Second)), time.Millisecond)
}

// takeShared takes up to want tokens of key's row, when at least need
// are there, else none; it returns what it took and what was there. A
// key's first take makes its row, full.
func (l *Limiter) takeShared(ctx context.Context, key string, burst, perSecond, want, need float64) (got, avail float64, err error) {
	for range 2 {
		err = l.db.Update(ctx, func(tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, `WITH b AS (
					SELECT limit_key, n.at,
						least($2::float8, tokens + greatest(0, extract(epoch FROM n.at - refilled_at)::float8) * $3::float8) AS avail
					FROM intake_rates CROSS JOIN LATERAL (SELECT clock_timestamp() AS at) n
					WHERE limit_key = $1 FOR UPDATE OF intake_rates),
				g AS (SELECT b.*, CASE WHEN b.avail >= $5::float8 THEN least($4::float8, floor(b.avail)) ELSE 0 END AS got FROM b),
				u AS (UPDATE intake_rates r SET tokens = g.avail - g.got, refilled_at = greatest(r.refilled_at, g.at)
					FROM g WHERE r.limit_key = g.limit_key AND g.got > 0)
				SELECT got, avail FROM g`, key, burst, perSecond, want, need).Scan(&got, &avail)
		})
		if errors.Is(err, sql.ErrNoRows) {
			err = l.db.Update(ctx, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO intake_rates (limit_key, tokens, refilled_at) VALUES ($1, $2, clock_timestamp())
					ON CONFLICT (limit_key) DO NOTHING`, key, burst)
				return err
			})
			if err == nil {
				continue
			}
		}
		break
	}
	if err != nil {
		return 0, 0, fmt.Errorf("intake rate %s: %w", key, err)
	}
	return got, avail, nil
}

// Wait takes n tokens of key's bucket at rate r, waiting until they are
// there (in pieces of at most the burst), and returns how long it
// waited. It returns early with ctx's error. A store that fails is asked
// again after a second.
func (l *Limiter) Wait(ctx context.Context, key string, r Rate, n int) (time.Duration, error) {
	if r.IsZero() {
		return 0, nil
	}
	var waited time.Duration
	burst := r.EffectiveBurst()
	for n > 0 {
		k := min(n, burst)
		ok, wait, _ := l.Take(ctx, key, r, k)
		if ok {
			n -= k
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return waited, ctx.Err()
		case <-t.C:
			waited += wait
		}
	}
	return waited, nil
}
