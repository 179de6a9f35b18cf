// Package outboxpg is the transactional outbox over PostgreSQL:
// a service writes its events with Insert (database/sql) or InsertPgx in the same transaction as the
// business write they announce, so both commit or neither does, and a
// Store hands them to an outbox.Relay that sends them to Redis Streams,
// JetStream or a postbox server.
//
// The payload is stored as the producer wrote it, byte for byte (a TEXT
// column: cast payload::jsonb to query into it), and relayed so.
//
// Several relays may share one outbox. Each claims the rows it sends with
// SELECT ... FOR UPDATE SKIP LOCKED and a lease (next_attempt_at moved
// Claim into the future), and extends the claims it still holds every
// third of Claim (the relay's heartbeat, Extend) for as long as it is
// sending or settling their rows, however slow the receiver or the
// database: no row is sent twice while its relay lives. A relay that dies
// mid-batch leaves its rows to be sent again by any relay once the claim
// ends. The receiver therefore sees each event at least once, and
// deduplicates on its event id (Nats-Msg-Id, Redis IDMP, dedup).
//
// Ordering: a relay hands rows out in seq (insert) order. Events reach the
// receiver in that order only with one relay and one batch in flight
// (RelayConfig.MaxInFlight = BatchSize), and even then a retried row comes
// after the rows sent while it waited, and a row whose transaction commits
// after a later-numbered row's may be sent after it. Across relays there
// is no order. Consumers that need order per entity should carry a version
// in the payload.
//
// A delivered row keeps delivered_at until the retention loop (Run)
// deletes it; a row refused for good or parked after RelayConfig.MaxAttempts
// stays with rejected_at and its last error until Requeue.
package outboxpg

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/retry"
)

// Defaults of Config.
const (
	DefaultClaim             = 30 * time.Second
	DefaultRetention         = 7 * 24 * time.Hour
	DefaultRetentionInterval = time.Hour
	// Channel is the LISTEN/NOTIFY channel the insert trigger notifies.
	Channel = "postbox_outbox"
)

// Config configures a Store. Zero fields take their defaults.
type Config struct {
	// Claim is how long a relay holds the rows it is sending without
	// extending the claim; a live relay extends it every quarter of Claim
	// (outbox.Extender), so it bounds how long the rows of a relay that
	// died wait before another relay sends them again. Defaults to 30s.
	Claim time.Duration
	// Retention is how long delivered rows are kept before Run deletes
	// them. Defaults to 7 days; negative keeps them for ever.
	Retention time.Duration
	// RetentionInterval is how often Run deletes. Defaults to 1h.
	RetentionInterval time.Duration
	Logger            *slog.Logger
	// ObserveRetention, when set, is called after each retention pass of
	// Run with the rows it deleted: 0 too, and those a pass that failed
	// deleted before it failed.
	ObserveRetention func(deleted int64)
}

// Store is a transactional outbox in PostgreSQL as an outbox.Relay sees it.
type Store struct {
	pool   *pgxpool.Pool
	cfg    Config
	log    *slog.Logger
	notify chan struct{}
	// settles bounds the Settles running at once to all but two of the
	// pool's connections, which stay free for Due and Extend: a relay
	// settles each publish beside the next, and a backlog of slow
	// settles would otherwise hold every connection while the claims
	// they wait on run out.
	settles chan struct{}
}

var (
	_ outbox.Store    = (*Store)(nil)
	_ outbox.Notifier = (*Store)(nil)
	_ outbox.Claimer  = (*Store)(nil)
	_ outbox.Extender = (*Store)(nil)
	_ outbox.Admin    = (*Store)(nil)
	_ outbox.RowAdmin = (*Store)(nil)
)

// Claims implements outbox.Claimer: Due claims the rows it returns.
func (s *Store) Claims() bool { return true }

// ClaimPeriod implements outbox.Extender: Config.Claim.
func (s *Store) ClaimPeriod() time.Duration { return s.cfg.Claim }

// Extend implements outbox.Extender in one statement: each row still
// pending under its claim's lease is claimed until the later of now and
// the database's clock, plus Claim (a HOT update, like the claim itself).
// A row locked at that moment (being settled) is skipped, not waited for.
func (s *Store) Extend(ctx context.Context, now time.Time, claims []outbox.Claim) (int64, error) {
	if len(claims) == 0 {
		return 0, nil
	}
	ids := make([]string, len(claims))
	leases := make([]time.Time, len(claims))
	for i, c := range claims {
		ids[i], leases[i] = c.EventID, c.Lease
	}
	// SKIP LOCKED: a row locked now is being settled (or claimed after
	// its claim ended); waiting for it would only deadlock with the
	// relay's own settles, which lock their rows in another order.
	tag, err := s.pool.Exec(ctx, `UPDATE outbox o SET next_attempt_at = greatest($1, now()) + $2::bigint * interval '1 microsecond'
		WHERE o.id = ANY(ARRAY(SELECT x.id FROM outbox x JOIN unnest($3::text[], $4::timestamptz[]) AS c(event_id, lease)
			ON x.event_id = c.event_id AND x.lease = c.lease
			WHERE x.delivered_at IS NULL AND x.rejected_at IS NULL FOR UPDATE OF x SKIP LOCKED))`,
		now, s.cfg.Claim.Microseconds(), ids, leases)
	if err != nil {
		return 0, fmt.Errorf("outbox extend claims: %w", err)
	}
	return tag.RowsAffected(), nil
}

// New returns a Store on pool. The outbox table must exist (Migrate).
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("outboxpg: no pool")
	}
	if cfg.Claim <= 0 {
		cfg.Claim = DefaultClaim
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.RetentionInterval <= 0 {
		cfg.RetentionInterval = DefaultRetentionInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{pool: pool, cfg: cfg, log: cfg.Logger, notify: make(chan struct{}, 1),
		settles: make(chan struct{}, max(1, int(pool.Config().MaxConns)-2))}, nil
}

// Exists reports whether the outbox table exists in the connection's
// search_path. A table named outbox of another shape (one without the
// columns postbox's relay needs, such as a hand-made one)
// is an error that says so.
func Exists(ctx context.Context, db Beginner) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	var ok bool
	var cols []string
	err = tx.QueryRow(ctx, `SELECT to_regclass('outbox') IS NOT NULL,
		coalesce((SELECT array_agg(attname::text) FROM pg_attribute
			WHERE attrelid = to_regclass('outbox') AND attnum > 0 AND NOT attisdropped), '{}')`).Scan(&ok, &cols)
	if err != nil || !ok {
		return false, err
	}
	for _, c := range []string{"seq", "event_id", "payload", "attempts", "next_attempt_at", "last_error", "delivered_at", "rejected_at"} {
		if !slices.Contains(cols, c) {
			return true, fmt.Errorf("a table named outbox exists but is not postbox's outbox: it has no column %s (it has %s); rename it, or point postbox at another schema with search_path", c, strings.Join(cols, ", "))
		}
	}
	return true, nil
}

// Insert writes events to the outbox inside the caller's database/sql
// transaction tx on PostgreSQL (the pgx driver,
// github.com/jackc/pgx/v5/stdlib): they commit with the business write or
// not at all. Events are prepared first (outbox.Event.Prepare fills in
// ids), so the caller can read the ids back. An event whose id is in the
// outbox already is not written and Insert returns an error wrapping
// outbox.ErrDuplicate; tx stays usable.
func Insert(ctx context.Context, tx *sql.Tx, events ...outbox.Event) error {
	args, err := insertArgs(ctx, events)
	if err != nil || args == nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, qInsert, args...)
	if err != nil {
		return fmt.Errorf("outbox insert: %w", err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return fmt.Errorf("outbox insert: %w", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox insert: %w", err)
	}
	return checkInserted(events, ids)
}

// InsertPgx is Insert for a pgx transaction.
func InsertPgx(ctx context.Context, tx pgx.Tx, events ...outbox.Event) error {
	args, err := insertArgs(ctx, events)
	if err != nil || args == nil {
		return err
	}
	rows, err := tx.Query(ctx, qInsert, args...)
	if err != nil {
		return fmt.Errorf("outbox insert: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("outbox insert: %w", err)
	}
	return checkInserted(events, ids)
}

const qInsert = `INSERT INTO outbox (event_id, event_type, payload, correlation_id, tenant_id, traceparent, tracestate)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
	ON CONFLICT (event_id) DO NOTHING RETURNING event_id`

func insertArgs(ctx context.Context, events []outbox.Event) ([]any, error) {
	if len(events) == 0 {
		return nil, nil
	}
	ids := make([]string, len(events))
	types := make([]string, len(events))
	payloads := make([]string, len(events))
	corr := make([]string, len(events))
	tenants := make([]string, len(events))
	parents := make([]string, len(events))
	states := make([]string, len(events))
	for i := range events {
		e := &events[i]
		if err := e.PrepareContext(ctx); err != nil {
			return nil, err
		}
		ids[i], types[i], payloads[i], corr[i], tenants[i] = e.ID, e.Type, string(e.Payload), e.CorrelationID, e.TenantID
		parents[i], states[i] = e.TraceParent, e.TraceState
	}
	return []any{ids, types, payloads, corr, tenants, parents, states}, nil
}

func checkInserted(events []outbox.Event, inserted []string) error {
	if len(inserted) == len(events) {
		return nil
	}
	for _, e := range events {
		if !slices.Contains(inserted, e.ID) {
			return fmt.Errorf("%w: %s", outbox.ErrDuplicate, e.ID)
		}
	}
	return fmt.Errorf("%w: an id appears twice in one Insert", outbox.ErrDuplicate)
}

// Notify implements outbox.Notifier: it receives after rows are inserted
// anywhere, while Run listens.
func (s *Store) Notify() <-chan struct{} { return s.notify }

func (s *Store) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Run listens for inserts (LISTEN postbox_outbox) and deletes delivered
// rows older than Retention every RetentionInterval, until ctx ends. A
// lost connection is dialled again; meanwhile the relay polls.
func (s *Store) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.retain(ctx)
	}()
	s.listen(ctx)
	<-done
	return nil
}

func (s *Store) listen(ctx context.Context) {
	backoff := retry.Backoff{Base: 100 * time.Millisecond, Max: 10 * time.Second}
	for failures := 0; ctx.Err() == nil; failures++ {
		listened, err := s.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listened {
			failures = 0 // the connection worked: start the backoff again
		}
		delay := backoff.Ceiling(failures)
		s.log.Warn("outbox: LISTEN connection lost; polling until it is back", "err", err, "retry_in", delay)
		s.wake() // rows may have come while nobody listened
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// listenOnce listens on one connection until it fails; listened says
// whether LISTEN took effect on it.
func (s *Store) listenOnce(ctx context.Context) (listened bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// The connection will be in LISTEN state; never hand it back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+Channel); err != nil {
		return false, err
	}
	s.wake()
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return true, err
		}
		s.wake()
	}
}

func (s *Store) retain(ctx context.Context) {
	if s.cfg.Retention < 0 {
		return
	}
	t := time.NewTicker(s.cfg.RetentionInterval)
	defer t.Stop()
	for {
		n, err := s.DeleteDelivered(ctx, time.Now().Add(-s.cfg.Retention))
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Error("outbox: deleting delivered rows failed", "err", err)
		case n > 0:
			s.log.Info("outbox: deleted delivered rows past retention", "rows", n, "retention", s.cfg.Retention)
		}
		if s.cfg.ObserveRetention != nil {
			s.cfg.ObserveRetention(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// DeleteDelivered deletes rows delivered before t, 1000 per transaction,
// and returns how many.
func (s *Store) DeleteDelivered(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `DELETE FROM outbox WHERE id IN (
			SELECT id FROM outbox WHERE delivered_at < $1 LIMIT 1000)`, before)
		if err != nil {
			return total, fmt.Errorf("outbox retention: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

// Due implements outbox.Store: it claims up to limit due rows after seq
// for Claim (FOR UPDATE SKIP LOCKED), in seq order. A row is due by the
// later of now and the database's clock, so that rows inserted with the
// database's now() are due at once to a relay whose clock lags behind it.
// Each message's Lease is the claim's end as stored (also kept in the
// lease column, which names the claim while Extend moves its end on), and
// its CreatedAt the row's created_at in UTC.
//
// The claimed ids are collected first (an InitPlan), so that the update
// finds each row by its primary key: a join on them would be planned as a
// hash join over a scan of the whole table, on every claim.
func (s *Store) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	rows, err := s.pool.Query(ctx, `UPDATE outbox o SET next_attempt_at = greatest($2, now()) + $3::bigint * interval '1 microsecond',
			lease = greatest($2, now()) + $3::bigint * interval '1 microsecond'
		WHERE o.id = ANY(ARRAY(SELECT id FROM outbox
			WHERE delivered_at IS NULL AND rejected_at IS NULL AND seq > $1 AND next_attempt_at <= greatest($2, now())
			ORDER BY seq LIMIT $4 FOR UPDATE SKIP LOCKED))
		RETURNING o.seq, o.event_id, o.event_type, o.payload, o.correlation_id, o.tenant_id, o.attempts, o.created_at, o.next_attempt_at,
			o.traceparent, o.tracestate`,
		after, now, s.cfg.Claim.Microseconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox due: %w", err)
	}
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		var m outbox.Message
		err := r.Scan(&m.Seq, &m.EventID, &m.Type, &m.Body, &m.CorrelationID, &m.TenantID, &m.Attempts, &m.CreatedAt, &m.Lease,
			&m.TraceParent, &m.TraceState)
		m.CreatedAt = m.CreatedAt.UTC() // sent in the envelope's ts as it is: in UTC, not the relay's zone
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox due: %w", err)
	}
	slices.SortFunc(msgs, func(a, b outbox.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return msgs, nil
}

// Settle implements outbox.Store in one statement, stamping delivered_at
// and rejected_at with the database's clock, like created_at. A Delivered
// outcome always applies, also to a row another relay has claimed or
// rejected since (the receiver has the event). Any other outcome applies
// only while the row still carries the claim it was sent under (its
// lease): a relay whose claim ended cannot make a row another relay is
// sending due again, nor park it. Every outcome that applies ends the
// claim, so that a heartbeat cannot move a retry's time. A transport
// failure (Unanswered) records its error without counting an attempt.
// At most all but two of the pool's connections settle at once (one when
// the pool has three or fewer), so that claiming and extending claims
// never wait behind a backlog of settles.
func (s *Store) Settle(ctx context.Context, outcomes []outbox.Outcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	ids := make([]string, len(outcomes))
	kinds := make([]int32, len(outcomes))
	errs := make([]string, len(outcomes))
	retry := make([]time.Time, len(outcomes))
	leases := make([]time.Time, len(outcomes))
	select {
	case s.settles <- struct{}{}:
		defer func() { <-s.settles }()
	case <-ctx.Done():
		return fmt.Errorf("outbox settle: %w", ctx.Err())
	}
	now := time.Now()
	for i, o := range outcomes {
		ids[i], kinds[i], errs[i], retry[i], leases[i] = o.EventID, int32(o.Kind), o.Error, o.RetryAt, o.Lease
		if o.Kind == outbox.Unanswered {
			retry[i] = now // due again at once; the relay paused itself
		}
	}
	_, err := s.pool.Exec(ctx, `UPDATE outbox o SET
			delivered_at    = CASE WHEN u.kind = $1 THEN now() END,
			rejected_at     = CASE WHEN u.kind = $2 THEN now() END,
			next_attempt_at = CASE WHEN u.kind IN ($1::int, $2::int) THEN o.next_attempt_at ELSE u.retry_at END,
			attempts        = o.attempts + CASE WHEN u.kind IN ($2::int, $3::int) THEN 1 ELSE 0 END,
			last_error      = CASE WHEN u.kind = $1 THEN o.last_error ELSE u.err END,
			lease           = NULL
		FROM unnest($4::text[], $5::int[], $6::text[], $7::timestamptz[], $8::timestamptz[]) AS u(event_id, kind, err, retry_at, lease)
		WHERE o.event_id = u.event_id AND o.delivered_at IS NULL
			AND (u.kind = $1 OR o.rejected_at IS NULL AND o.lease = u.lease)`,
		int32(outbox.Delivered), int32(outbox.Rejected), int32(outbox.Retry), ids, kinds, errs, retry, leases)
	if err != nil {
		return fmt.Errorf("outbox settle: %w", err)
	}
	return nil
}

// Counts returns how many rows are pending (not yet delivered) and
// rejected.
func (s *Store) Counts(ctx context.Context) (pending, rejected int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE delivered_at IS NULL AND rejected_at IS NULL),
		count(*) FILTER (WHERE rejected_at IS NOT NULL)
		FROM outbox WHERE delivered_at IS NULL`).Scan(&pending, &rejected)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox counts: %w", err)
	}
	return pending, rejected, nil
}

// OldestPending returns when the oldest undelivered row was inserted; ok
// is false when nothing is pending.
func (s *Store) OldestPending(ctx context.Context) (t time.Time, ok bool, err error) {
	var created *time.Time
	err = s.pool.QueryRow(ctx, `SELECT created_at FROM outbox
		WHERE delivered_at IS NULL AND rejected_at IS NULL ORDER BY seq LIMIT 1`).Scan(&created)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("outbox oldest pending: %w", err)
	}
	return *created, true, nil
}

// List returns up to limit rows in state (outbox.StatePending,
// StateRejected, StateDelivered, or "" for all), oldest first.
func (s *Store) List(ctx context.Context, state string, limit int) ([]outbox.Row, error) {
	where := map[string]string{
		"":                    "TRUE",
		outbox.StatePending:   "delivered_at IS NULL AND rejected_at IS NULL",
		outbox.StateRejected:  "rejected_at IS NOT NULL",
		outbox.StateDelivered: "delivered_at IS NOT NULL",
	}[state]
	if where == "" {
		return nil, fmt.Errorf("outbox list: unknown state %q", state)
	}
	return s.rows(ctx, "outbox list", `SELECT `+rowColumns+` FROM outbox WHERE `+where+` ORDER BY seq LIMIT $1`, limit)
}

// rowColumns are the columns rows reads, in its order.
const rowColumns = `event_id, event_type,
	CASE WHEN delivered_at IS NOT NULL THEN 'delivered' WHEN rejected_at IS NOT NULL THEN 'rejected' ELSE 'pending' END,
	created_at, next_attempt_at, attempts, coalesce(last_error, ''), payload, correlation_id, tenant_id, delivered_at`

// rows runs q, a SELECT of rowColumns, and returns its rows; what names
// the caller in an error.
func (s *Store) rows(ctx context.Context, what, q string, args ...any) ([]outbox.Row, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Row, error) {
		var row outbox.Row
		err := r.Scan(&row.EventID, &row.Type, &row.State, &row.CreatedAt, &row.NextAttemptAt, &row.Attempts,
			&row.LastError, &row.Payload, &row.CorrelationID, &row.TenantID, &row.DeliveredAt)
		return row, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// Rows returns the rows of ids, in any state; an id the outbox does not
// hold has no row.
func (s *Store) Rows(ctx context.Context, ids []string) ([]outbox.Row, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return s.rows(ctx, "outbox rows", `SELECT `+rowColumns+` FROM outbox WHERE event_id = ANY($1) ORDER BY seq`, ids)
}

// Drop deletes rejected rows for good: those of ids, or with no ids every
// rejected row. It returns the ids it deleted.
func (s *Store) Drop(ctx context.Context, ids []string) ([]string, error) {
	q := `DELETE FROM outbox WHERE rejected_at IS NOT NULL`
	args := []any{}
	if len(ids) > 0 {
		q += ` AND event_id = ANY($1)`
		args = append(args, ids)
	}
	rows, err := s.pool.Query(ctx, q+` RETURNING event_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox drop: %w", err)
	}
	dropped, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("outbox drop: %w", err)
	}
	return dropped, nil
}

// Requeue makes rejected rows pending and due now, with their attempts
// reset; with no ids, every rejected row. It returns how many.
func (s *Store) Requeue(ctx context.Context, ids []string) (int64, error) {
	q := `UPDATE outbox SET rejected_at = NULL, attempts = 0, next_attempt_at = now() WHERE rejected_at IS NOT NULL`
	args := []any{}
	if len(ids) > 0 {
		q += ` AND event_id = ANY($1)`
		args = append(args, ids)
	}
	tag, err := s.pool.Exec(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox requeue: %w", err)
	}
	if tag.RowsAffected() > 0 {
		// Wake relays listening elsewhere; they poll as well.
		if _, err := s.pool.Exec(ctx, `SELECT pg_notify($1, '')`, Channel); err != nil {
			s.log.Warn("outbox: requeued rows, but notifying relays failed; they will find them when they poll", "err", err)
		}
		s.wake()
	}
	return tag.RowsAffected(), nil
}
