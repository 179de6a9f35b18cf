package delivery

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// retryDelay is how long a loop waits after a failed read or commit.
const retryDelay = time.Second

// waitRecheck bounds a loop's wait for new events on a stream.Waiter:
// after it, the loop reads again whether it was woken or not.
const waitRecheck = 2 * time.Second

// Polling delays of a loop whose stream backend is no stream.Waiter: the
// first look after an empty read, doubling up to the last while the
// stream stays idle.
const (
	pollMin = 50 * time.Millisecond
	pollMax = time.Second
)

// consume runs s's consumption loop until ctx ends or s is deleted.
func (d *Delivery) consume(ctx context.Context, s Subscription) {
	log := d.log.With("subscription", s.Name)
	m := newMatcher(s)
	d.forgetInline(s.UID) // the position is read from the store below
	c, ok := d.ensureConsumer(ctx, log, s, s.Start)
	if !ok {
		return
	}
	var next int64
	for {
		var err error
		if next, err = d.startPosition(ctx, s, c.NextOffset); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrNotFound) {
			// Deleted while the loop started (a claim round of a shared
			// store read it just before): the consumer made above goes too.
			d.dropConsumer(ctx, log, s)
			return
		}
		log.Error("delivery: cannot read or record the subscription's position; retrying", "err", err)
		if !sleep(ctx, retryDelay) {
			return
		}
	}
	// The consumer's commits run beside the loop, so that the loop never
	// waits for them: on SQLite each is a write of its own.
	f := &follower{d: d, log: log, name: s.Name, wake: make(chan struct{}, 1)}
	var following sync.WaitGroup
	defer following.Wait() // a Reset waits for the last commit
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	following.Go(func() { f.run(ctx) })
	if c.NextOffset < next { // a crash after a batch's transaction took the consumer's commit with it
		f.follow(next - 1)
	}
	followed := next - 1 // the last offset given to f
	items := make([]pendingItem, 0, d.cfg.BatchSize)
	idle := time.Duration(0)
	for ctx.Err() == nil {
		// Items written with their events (InlineHook) moved the position
		// before the stream's waiters woke: those events are not read
		// back. Wait for the next ones, which are likely inline too.
		inline := false
		if in := d.inlineNext(s.UID); in > next {
			next, inline = in, true
			// The consumer follows a batch's worth at a time, and when
			// the stream goes idle: each commit of it is a write.
			if next-1-followed >= int64(d.cfg.BatchSize) {
				f.follow(next - 1)
				followed = next - 1
			}
		}
		var batch stream.Batch
		var err error
		if !inline || d.waiter == nil {
			batch, err = d.streams.Read(ctx, s.Name, next, d.cfg.BatchSize)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, stream.ErrConsumerNotFound) {
				if _, found, perr := d.position(ctx, s.UID); perr == nil && !found {
					return // the subscription was deleted (by another node) with its consumer
				}
				// Deleted from outside delivery: the position still says
				// where the subscription is.
				log.Warn("delivery: the subscription's stream consumer is gone; creating it again at its position", "offset", next)
				if _, ok := d.ensureConsumer(ctx, log, s, stream.Start{Policy: stream.StartAtOffset, Offset: next}); !ok {
					return
				}
				continue
			}
			log.Error("delivery: read failed; retrying", "offset", next, "err", err)
			sleep(ctx, retryDelay)
			continue
		}
		if len(batch.Events) == 0 {
			if d.waiter != nil {
				// A wake-up can be lost (a JetStream client reconnecting
				// to another server misses the messages meanwhile), so the
				// wait ends after waitRecheck and the loop reads again.
				wctx, cancel := context.WithTimeout(ctx, waitRecheck)
				err := d.waiter.Wait(wctx, s.Stream, next-1)
				cancel()
				switch {
				case ctx.Err() != nil:
					return
				case errors.Is(err, context.DeadlineExceeded):
					if followed < next-1 { // idle: the consumer catches up with inline items
						f.follow(next - 1)
						followed = next - 1
					}
				case err != nil:
					log.Warn("delivery: waiting for new events failed; reading again", "err", err)
					sleep(ctx, retryDelay)
				}
				continue
			}
			idle = min(max(2*idle, pollMin), pollMax)
			if !sleep(ctx, idle) {
				return
			}
			continue
		}
		idle = 0
		items = items[:0]
		for i := range batch.Events {
			if m.match(&batch.Events[i]) {
				items = append(items, pendingItem{ev: &batch.Events[i]})
			}
		}
		first, last := batch.Events[0].Offset, batch.Events[len(batch.Events)-1].Offset
		added := 0
		span := materialiseSpan(s.Name, batch.Events) // trace.go
		err = d.update(ctx, func(tx conn) error {
			if err := advancePosition(ctx, tx, s, next, last+1, d.now()); err != nil {
				return err
			}
			var err error
			if added, err = d.materialise(ctx, tx, s, items); err != nil {
				return err
			}
			if added > 0 && d.shared != nil { // wakes the other processes' workers at commit
				if err := notifyIn(ctx, tx, "inbox:"+s.Inbox); err != nil {
					return err
				}
			}
			return nil
		})
		endMaterialise(span, added, err)
		switch {
		case err == nil:
			next = last + 1
			if added > 0 {
				d.inboxes.notify(s.Inbox)
			}
			d.cfg.Metrics.materialised(s.Name, len(batch.Events), added)
			f.follow(last)
			followed = last
		case errors.Is(err, errPositionMoved):
			// Moved from outside the loop: follow it, or stop when the
			// subscription is gone.
			pos, found, perr := d.position(ctx, s.UID)
			switch {
			case perr != nil:
				sleep(ctx, retryDelay)
			case !found:
				return
			default:
				next = pos
			}
		case ctx.Err() != nil:
			return
		default:
			log.Error("delivery: materialising a batch failed; retrying", "from", first, "to", last, "err", err)
			sleep(ctx, retryDelay)
		}
	}
}

// dropConsumer deletes the stream consumer of s, which was deleted, unless
// a subscription of its name exists again.
func (d *Delivery) dropConsumer(ctx context.Context, log *slog.Logger, s Subscription) {
	if now, err := d.Subscription(ctx, s.Name); err == nil && now.UID != s.UID || err != nil && !errors.Is(err, ErrNotFound) {
		return
	}
	if err := d.streams.DeleteConsumer(ctx, s.Name); err != nil && !errors.Is(err, stream.ErrConsumerNotFound) {
		log.Warn("delivery: deleting the consumer of a deleted subscription failed", "err", err)
	}
}

// ensureConsumer returns s's stream consumer, creating it at start if
// needed, retrying until ctx ends (then ok is false).
func (d *Delivery) ensureConsumer(ctx context.Context, log *slog.Logger, s Subscription, start stream.Start) (_ stream.Consumer, ok bool) {
	for {
		c, err := d.streams.EnsureConsumer(ctx, stream.ConsumerConfig{ID: s.Name, StreamID: s.Stream, Start: start})
		if err == nil {
			return c, true
		}
		if ctx.Err() != nil {
			return c, false
		}
		log.Error("delivery: cannot create the consumer; retrying", "err", err)
		if !sleep(ctx, retryDelay) {
			return c, false
		}
	}
}

// follower commits a subscription's stream consumer after its position,
// so that the backend shows the subscription's lag. It commits the newest
// offset it was given each time its last commit is done: while a commit is
// under way, the batches finished meanwhile fold into the next one. The
// position is what counts: a commit that fails is logged (once until one
// succeeds) and made good by the next, and one that a stop interrupts by
// the next start of the loop.
type follower struct {
	d    *Delivery
	log  *slog.Logger
	name string
	wake chan struct{} // capacity 1

	mu   sync.Mutex
	last int64 // the offset to commit; 0: none

	failed bool // run's own
}

// follow asks for a commit of last, the last offset of the batch the
// position moved past.
func (f *follower) follow(last int64) {
	f.mu.Lock()
	f.last = last
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run commits what follow asks for until ctx ends.
func (f *follower) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		}
		f.mu.Lock()
		last := f.last
		f.last = 0
		f.mu.Unlock()
		if last > 0 {
			f.commit(ctx, last)
		}
	}
}

func (f *follower) commit(ctx context.Context, last int64) {
	_, err := f.d.streams.Commit(ctx, f.name, last)
	switch {
	case err == nil:
		if f.failed {
			f.log.Info("delivery: the stream consumer follows the subscription's position again", "offset", last+1)
		}
		f.failed = false
	case ctx.Err() != nil:
	case errors.Is(err, stream.ErrCommitBehind):
		// The consumer was moved ahead outside delivery; the position
		// stays what the loop reads from.
		f.log.Debug("delivery: the stream consumer is ahead of the subscription's position", "offset", last+1)
	default:
		if !f.failed {
			f.log.Warn("delivery: committing the stream consumer failed; the subscription goes on from its position", "offset", last+1, "err", err)
		}
		f.failed = true
	}
}

type pendingItem struct{ ev *stream.StoredEvent }

// itemChunk is how many items one INSERT writes: the SQLite driver binds
// arguments in time quadratic in their number, so statements stay small.
const itemChunk = 4

const itemInsert = `INSERT INTO inbox_items (inbox_id, subscription_id, subscription_uid, stream_id, "offset",
	source_native_id, event_type, occurred_at, stored_at, metadata_json, payload_json, delivery_handle_json,
	next_attempt_at, created_at, updated_at, source_sequence, order_key) VALUES `

const itemRow = `(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`

// materialise writes items inside tx, and returns how many it added. An
// item that exists already (its event was read again after a Reset
// backwards) is skipped.
func (d *Delivery) materialise(ctx context.Context, tx conn, s Subscription, items []pendingItem) (int, error) {
	if len(items) == 0 {
		return 0, nil
	}
	now := d.now().UTC().Format(sqlitedb.Time)
	var full *sql.Stmt
	args := make([]any, 0, itemChunk*17)
	added := 0
	for rest := items; len(rest) > 0; {
		part := rest[:min(itemChunk, len(rest))]
		rest = rest[len(part):]
		args = args[:0]
		for _, it := range part {
			args = appendItemArgs(args, &s, it.ev, now)
		}
		var stmt *sql.Stmt
		var err error
		if len(part) == itemChunk {
			if full == nil {
				if full, err = tx.PrepareContext(ctx, itemInsert+itemRow+strings.Repeat(","+itemRow, itemChunk-1)+itemConflict); err != nil {
					return 0, fmt.Errorf("materialise: %w", err)
				}
				defer full.Close()
			}
			stmt = full
		} else {
			if stmt, err = tx.PrepareContext(ctx, itemInsert+itemRow+strings.Repeat(","+itemRow, len(part)-1)+itemConflict); err != nil {
				return 0, fmt.Errorf("materialise: %w", err)
			}
			defer stmt.Close()
		}
		r, err := stmt.ExecContext(ctx, args...)
		if err != nil {
			return 0, fmt.Errorf("materialise: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return 0, fmt.Errorf("materialise: %w", err)
		}
		added += int(n)
	}
	if added == 0 {
		return 0, nil
	}
	t := tally{}
	t.move(s.Inbox, s.UID, "", StatePending, int64(added))
	if err := t.write(ctx, d, tx); err != nil {
		return 0, fmt.Errorf("materialise: %w", err)
	}
	return added, nil
}

// itemConflict ends an insert of items: an item that exists is skipped.
const itemConflict = ` ON CONFLICT DO NOTHING`

// matcher decides which events a subscription takes.
type matcher struct {
	types    [][]string // each pattern split at its *s
	metadata map[string]string
}

func newMatcher(s Subscription) *matcher {
	m := &matcher{metadata: s.Metadata}
	for _, t := range s.Types {
		m.types = append(m.types, strings.Split(t, "*"))
	}
	return m
}

func (m *matcher) match(ev *stream.StoredEvent) bool {
	if len(m.types) > 0 {
		ok := false
		for _, p := range m.types {
			if globMatch(p, ev.Type) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(m.metadata) == 0 {
		return true
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(ev.Metadata, &meta) != nil {
		return false
	}
	for k, want := range m.metadata {
		if !jsonEquals(meta[k], want) {
			return false
		}
	}
	return true
}

// globMatch reports whether s matches the pattern whose parts were split
// at each *: the first part is a prefix, the last a suffix, and the ones
// between appear in order.
func globMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return s == parts[0]
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// jsonEquals reports whether the JSON value v is the string want, or a
// number, boolean or null written as want.
func jsonEquals(v json.RawMessage, want string) bool {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return false
	}
	if v[0] == '"' {
		var s string
		return json.Unmarshal(v, &s) == nil && s == want
	}
	return string(v) == want
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
