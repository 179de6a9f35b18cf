package delivery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-events/postbox/internal/schedule"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// Inline items. On the embedded default the store is the stream backend's
// own database, written by one writer, so a subscription's items can be
// written in the transaction that stores their events (InlineHook): the
// subscription's loop then neither reads those events back nor writes
// their items in a transaction of its own. The position moves past the
// events in that transaction too, but only when it was at the first of
// them: a subscription whose loop is behind (after a restart, a Reset, a
// backlog) leaves them to its loop, which makes their items as it makes
// any other's, and the next transaction that finds the position where
// its events start writes inline again.

// inlineState is Delivery's record of inline items: how far each
// subscription's position moved with them, for its loop.
type inlineState struct {
	next sync.Map // subscription uid → *atomic.Int64: the position after the newest inline items committed
}

// inliner writes one subscription's items in the transactions of its
// events (InlineHook). It runs on the writer goroutine.
type inliner struct {
	d    *Delivery
	name string

	position, move, count *sql.Stmt
	inserts               [itemChunk + 1]*sql.Stmt // by row count

	sub       *Subscription // cached; nil: look it up, from lookAfter on
	lookAfter time.Time
	m         *matcher
	subArgs   [3]any // sub's Inbox, Name and UID as bound arguments, boxed once
	items     []pendingItem
	args      []any
}

// InlineHook returns a function that writes the items of subscription
// name in the transaction that appends their events, for a stream
// backend that runs such functions in its writer (a
// streamsqlite.AppendHook), or nil when delivery cannot: its store is not
// the stream backend's database (PostgreSQL, or SQLite beside another
// stream backend). Register it on the stream the subscription reads; a
// subscription of that name that does not exist, or reads another stream,
// gets nothing written, and one created again later is found.
func (d *Delivery) InlineHook(ctx context.Context, name string) (func(tx *sql.Tx, events []stream.StoredEvent) (func(), error), error) {
	p, ok := d.store.(sqlitedb.WritePreparer)
	if d.shared != nil || d.pg || any(d.store) != any(d.streams) || !ok {
		return nil, nil
	}
	in := &inliner{d: d, name: name}
	var err error
	if in.position, err = p.PrepareWrite(ctx, `SELECT next_offset FROM positions WHERE subscription_uid = ?`); err != nil {
		return nil, fmt.Errorf("inline items of %s: %w", name, err)
	}
	if in.move, err = p.PrepareWrite(ctx, `UPDATE positions SET next_offset = ?, updated_at = ? WHERE subscription_uid = ? AND next_offset = ?`); err != nil {
		return nil, fmt.Errorf("inline items of %s: %w", name, err)
	}
	if in.count, err = p.PrepareWrite(ctx, countInsert+`(?, ?, ?, 0, 0, 0)`); err != nil {
		return nil, fmt.Errorf("inline items of %s: %w", name, err)
	}
	for n := 1; n <= itemChunk; n++ {
		if in.inserts[n], err = p.PrepareWrite(ctx, itemInsert+itemRow+strings.Repeat(","+itemRow, n-1)+itemConflict); err != nil {
			return nil, fmt.Errorf("inline items of %s: %w", name, err)
		}
	}
	return in.write, nil
}

// write writes the items of events, which the transaction tx stored, when
// the subscription's position is at the first of them, and moves the
// position past the last. The function it returns tells the loop and
// wakes the inbox once tx committed.
//
// It runs on the writer, which every webhook waits for, so it binds few
// boxed values: the subscription's once, the stream's and the time's once
// a call; and it moves the position with one conditional UPDATE, reading
// the position only when that moved nothing.
func (in *inliner) write(tx *sql.Tx, events []stream.StoredEvent) (func(), error) {
	ctx := context.Background()
	d := in.d
	if in.sub == nil {
		if time.Now().Before(in.lookAfter) {
			return nil, nil
		}
		s, err := d.Subscription(ctx, in.name) // on a reader
		if err != nil || s.Stream != events[0].StreamID {
			in.lookAfter = time.Now().Add(time.Second) // none reads this stream under that name: nothing to write
			return nil, nil
		}
		in.sub, in.m = &s, newMatcher(s)
		in.subArgs = [3]any{s.Inbox, s.Name, s.UID}
	}
	s := in.sub
	first, last := events[0].Offset, events[len(events)-1].Offset
	nowText := d.now().UTC().Format(sqlitedb.Time)
	now := any(nowText)
	r, err := tx.StmtContext(ctx, in.move).ExecContext(ctx, last+1, now, in.subArgs[2], first)
	if err != nil {
		return nil, fmt.Errorf("inline items of %s: move position: %w", s.Name, err)
	}
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return nil, in.notAt(ctx, tx, err)
	}
	items := in.items[:0]
	for i := range events {
		if in.m.match(&events[i]) {
			items = append(items, pendingItem{ev: &events[i]})
		}
	}
	in.items = items
	defer clear(items)
	rows := inlineRows{stream: events[0].StreamID, now: now, nowText: nowText}
	var added int64
	for rest := items; len(rest) > 0; {
		part := rest[:min(itemChunk, len(rest))]
		rest = rest[len(part):]
		args := in.args[:0]
		for _, it := range part {
			args = rows.append(args, &in.subArgs, it.ev, s.orderKey(it.ev))
		}
		in.args = args
		r, err := tx.StmtContext(ctx, in.inserts[len(part)]).ExecContext(ctx, args...)
		clear(args)
		if err != nil {
			return nil, fmt.Errorf("inline items of %s: %w", s.Name, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("inline items of %s: %w", s.Name, err)
		}
		added += n
	}
	if added > 0 { // one row of the kept counts a transaction
		if _, err := tx.StmtContext(ctx, in.count).ExecContext(ctx, in.subArgs[0], in.subArgs[2], added); err != nil {
			return nil, fmt.Errorf("inline items of %s: count: %w", s.Name, err)
		}
		d.countRows.Add(1)
	}
	uid, inbox, read := s.UID, s.Inbox, len(events)
	return func() {
		d.inlined(uid, last+1)
		if added > 0 {
			d.inboxes.notify(inbox)
		}
		d.cfg.Metrics.materialised(in.name, read, int(added))
	}, nil
}

// notAt is write's answer when moving the position moved nothing (or
// failed to say, err): the position is not where the events start, the
// loop is behind (or was moved) and takes them; or there is none, and the
// subscription was deleted (one created again has another uid) or its
// loop has not started yet, so it is looked up again in a while.
func (in *inliner) notAt(ctx context.Context, tx *sql.Tx, err error) error {
	if err == nil {
		var next int64
		err = tx.StmtContext(ctx, in.position).QueryRowContext(ctx, in.sub.UID).Scan(&next)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		in.sub, in.lookAfter = nil, time.Now().Add(time.Second)
		return nil
	case err != nil:
		return fmt.Errorf("inline items of %s: %w", in.sub.Name, err)
	}
	return nil
}

// inlineRows boxes the values of itemRow that one call of write shares:
// the stream, the time, and the time the events were stored (the same for
// a group commit's events), formatted once.
type inlineRows struct {
	stream, now any
	nowText     string // now, unboxed
	stored      time.Time
	storedArg   any
}

// append appends the values of itemRow for ev's item, of the subscription
// whose Inbox, Name and UID sub holds boxed, with its order key: what
// appendItemArgs appends.
func (r *inlineRows) append(args []any, sub *[3]any, ev *stream.StoredEvent, key any) []any {
	var handle, seq any
	if len(ev.DeliveryHandle) > 0 {
		handle = string(ev.DeliveryHandle)
	}
	if ev.Sequence != nil {
		seq = *ev.Sequence
	}
	if r.storedArg == nil || !ev.StoredAt.Equal(r.stored) {
		r.stored, r.storedArg = ev.StoredAt, ev.StoredAt.UTC().Format(sqlitedb.Time)
	}
	due := r.now
	if at, ok := schedule.Of(ev.Metadata); ok {
		due = dueText(at, r.nowText)
	}
	return append(args, sub[0], sub[1], sub[2], r.stream, ev.Offset, ev.NativeID, ev.Type,
		ev.OccurredAt.UTC().Format(sqlitedb.Time), r.storedArg,
		string(ev.Metadata), string(ev.Payload), handle, due, r.now, r.now, seq, key)
}

// appendItemArgs appends the values of itemRow for ev's item in s.
func appendItemArgs(args []any, s *Subscription, ev *stream.StoredEvent, now string) []any {
	var handle any
	if len(ev.DeliveryHandle) > 0 {
		handle = string(ev.DeliveryHandle)
	}
	due := now
	if at, ok := schedule.Of(ev.Metadata); ok {
		due = dueText(at, now)
	}
	return append(args, s.Inbox, s.Name, s.UID, ev.StreamID, ev.Offset, ev.NativeID, ev.Type,
		ev.OccurredAt.UTC().Format(sqlitedb.Time), ev.StoredAt.UTC().Format(sqlitedb.Time),
		string(ev.Metadata), string(ev.Payload), handle, due, now, now, ev.Sequence, s.orderKey(ev))
}

// dueText is the next_attempt_at of an item whose event is scheduled for
// at (its metadata's schedule.Key), made at now (in sqlitedb.Time): at,
// or now when at is past. Its lease waits for it (leaseDueSQLite,
// leasePostgres).
func dueText(at time.Time, now string) string {
	if t := at.UTC().Format(sqlitedb.Time); t > now {
		return t
	}
	return now
}

// inlined records that inline items moved subscription uid's position to
// next in a transaction that committed.
func (d *Delivery) inlined(uid string, next int64) {
	v, _ := d.inline.next.LoadOrStore(uid, new(atomic.Int64))
	pos := v.(*atomic.Int64)
	for {
		cur := pos.Load()
		if cur >= next || pos.CompareAndSwap(cur, next) {
			return
		}
	}
}

// inlineNext returns the position inline items moved subscription uid to
// in transactions that committed since its loop started (0 when none
// did): its loop goes on from there instead of reading those events back.
func (d *Delivery) inlineNext(uid string) int64 {
	if v, ok := d.inline.next.Load(uid); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// forgetInline drops what inline items told the loop of uid: a loop that
// starts reads its position from the store (a Reset may have moved it
// back).
func (d *Delivery) forgetInline(uid string) { d.inline.next.Delete(uid) }
