package delivery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/stream"
)

// errPositionMoved: a loop's position is not where the loop left it (a
// Reset or a Delete moved it); the batch is not written.
var errPositionMoved = errors.New("delivery: the subscription's position moved")

// position returns the stored position of the subscription uid: the next
// offset its loop materialises.
func (d *Delivery) position(ctx context.Context, uid string) (next int64, found bool, _ error) {
	err := d.db.QueryRowContext(ctx, `SELECT next_offset FROM positions WHERE subscription_uid = ?`, uid).Scan(&next)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("read position of %s: %w", uid, err)
	}
	return next, true, nil
}

// startPosition returns where s's loop starts: its stored position, or,
// when it has none (a new subscription, or one older than positions),
// consumerNext, its stream consumer's offset, which it records.
func (d *Delivery) startPosition(ctx context.Context, s Subscription, consumerNext int64) (int64, error) {
	if next, found, err := d.position(ctx, s.UID); err != nil || found {
		return next, err
	}
	now := d.now().UTC().Format(sqlitedb.Time)
	err := d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO positions (subscription_uid, subscription_id, stream_id, next_offset, updated_at)
			SELECT subscription_uid, subscription_id, stream_id, ?, ? FROM subscriptions WHERE subscription_uid = ?
			ON CONFLICT (subscription_uid) DO NOTHING`, consumerNext, now, s.UID)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("record position of %s: %w", s.Name, err)
	}
	next, found, err := d.position(ctx, s.UID)
	if err == nil && !found {
		return 0, errorf(ErrNotFound, "subscription %q: deleted", s.Name)
	}
	return next, err
}

// advancePosition moves s's position from from to next inside tx, or
// returns errPositionMoved when it is not at from.
func advancePosition(ctx context.Context, tx conn, s Subscription, from, next int64, now time.Time) error {
	r, err := tx.ExecContext(ctx, `UPDATE positions SET next_offset = ?, updated_at = ? WHERE subscription_uid = ? AND next_offset = ?`,
		next, now.UTC().Format(sqlitedb.Time), s.UID, from)
	if err != nil {
		return fmt.Errorf("move position: %w", err)
	}
	if n, err := r.RowsAffected(); err != nil {
		return fmt.Errorf("move position: %w", err)
	} else if n == 0 {
		return errPositionMoved
	}
	return nil
}

// Reset moves subscription name to start: its loop stops, its stream
// consumer is reset (created when it is missing), its position becomes the
// consumer's new offset, and its loop starts again from there. It returns
// the consumer. An unknown subscription is ErrNotFound; a start the stream
// refuses (an offset past its end) is ErrInvalid.
//
// Items are unique per subscription and event, whatever their state: a
// Reset backwards reads events again but makes no second item of an event
// the subscription has an item of (to deliver items again, replay them, or
// create another subscription), only items of events it never took or
// whose items retention deleted. A Reset forwards skips events: no item is
// made of them.
func (d *Delivery) Reset(ctx context.Context, name string, start stream.Start) (stream.Consumer, error) {
	if start.Policy == "" {
		start.Policy = stream.StartLatest
	}
	if err := start.Validate(); err != nil {
		return stream.Consumer{}, errorf(ErrInvalid, "start %q: use latest, earliest, at_offset with start_offset ≥ 1, or at_time with start_time", start.Policy)
	}
	d.admin.Lock()
	defer d.admin.Unlock()
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return stream.Consumer{}, err
	}
	d.mu.Lock()
	l := d.loops[name]
	delete(d.loops, name)
	d.held[name] = true
	d.mu.Unlock()
	if l != nil {
		l.cancel()
		<-l.done
	}
	defer func() {
		d.mu.Lock()
		delete(d.held, name)
		d.startLocked(s)
		d.mu.Unlock()
	}()
	c, err := d.streams.Reset(ctx, name, start)
	if errors.Is(err, stream.ErrConsumerNotFound) {
		c, err = d.streams.EnsureConsumer(ctx, stream.ConsumerConfig{ID: name, StreamID: s.Stream, Start: start})
	}
	if err != nil {
		return c, fmt.Errorf("reset %s: %w", name, translate(err))
	}
	now := d.now().UTC().Format(sqlitedb.Time)
	err = d.update(ctx, func(tx conn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO positions (subscription_uid, subscription_id, stream_id, next_offset, updated_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (subscription_uid) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at`,
			s.UID, s.Name, s.Stream, c.NextOffset, now)
		return err
	})
	if err != nil {
		// The consumer moved but the position did not: the loop goes on
		// from the position, and the next batch's commit is refused
		// (behind) or moves the consumer back to where the loop is.
		return c, fmt.Errorf("reset %s: record position %d: %w", name, c.NextOffset, err)
	}
	if l == nil { // its loop may run in another process
		d.broadcast(ctx, "reset:"+name)
	}
	d.log.Info("delivery: subscription reset", "subscription", name, "start", start.Policy, "offset", c.NextOffset)
	return c, nil
}

// Lag returns how far subscription name is behind its stream: from its
// position (Lag.NextOffset, the next offset it materialises) to the
// stream's high watermark. Its stream consumer may trail the position by
// the batch being committed; this does not. An unknown subscription is
// ErrNotFound.
func (d *Delivery) Lag(ctx context.Context, name string) (stream.Lag, error) {
	s, err := d.Subscription(ctx, name)
	if err != nil {
		return stream.Lag{}, err
	}
	return d.lag(ctx, s, nil)
}

// lag is Lag of s; stats caches the streams' high watermarks (may be nil).
func (d *Delivery) lag(ctx context.Context, s Subscription, stats map[string]int64) (stream.Lag, error) {
	next, found, err := d.position(ctx, s.UID)
	if err != nil {
		return stream.Lag{}, err
	}
	if !found { // its loop has not started yet
		lag, err := d.streams.Lag(ctx, s.Name)
		if err != nil {
			return lag, translate(err)
		}
		return lag, nil
	}
	hw, ok := stats[s.Stream]
	if !ok {
		st, err := d.streams.Stats(ctx, s.Stream)
		if err != nil {
			return stream.Lag{}, translate(err)
		}
		hw = st.LastOffset
		if stats != nil {
			stats[s.Stream] = hw
		}
	}
	return stream.Lag{ConsumerID: s.Name, StreamID: s.Stream, NextOffset: next, HighWatermark: hw, Events: stream.LagOf(next, hw)}, nil
}
