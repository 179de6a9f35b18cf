package delivery

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"slices"
	"time"
)

// An endpoint's rate and concurrency over every process of a shared
// store (PostgreSQL). One process (SQLite) keeps both in memory, in its
// flow (admit); with a shared store every process delivers every inbox,
// so each limit must be counted once, in the store:
//
//   - The rate is one token bucket per inbox (endpoint_rates), refilled
//     by the store's clock. A process takes tokens for up to the items
//     its workers have room for, in one statement (a row locked, and
//     updated when it takes some), just before it leases them, and gives
//     back at once the tokens its lease found no items for. It takes a
//     batch only when a tenth of a second's worth (at least 1) is there,
//     and after a batch it waits until the next can be there, so that the
//     bucket is written about ten times a second whatever the rate and
//     however many processes share it (9.8 a second for three processes
//     at 50/s; BENCHMARKS.md). Over any window the processes together
//     start at most the rate's burst (one second's worth) plus the rate
//     times the window.
//
//   - The concurrency is slots 1 to the limit (endpoint_slots), each held
//     by one process. A process with items to send takes slots in one
//     INSERT … ON CONFLICT (at first up to its share, the limit over the
//     live processes, then any left free, trying again at most every
//     slotRetry), keeps them while it has items to send, so that an
//     attempt costs no statement, and gives back those it does not use
//     once its leases have found nothing for slotLinger; idle, it holds
//     one to look for items with. A slot is free when its holder's node
//     lease (delivery_leases) ended: the slots of a process that died come
//     back within the lease TTL. A process that cannot renew its lease
//     stops using its slots before the lease can end (cluster.holds), as
//     it stops its loops; attempts already in flight run on to their end.
//
// Why not each process taking its share of the limit (the limit over the
// live processes, counted in memory): it needs no statement per attempt,
// but the shares change with every process that comes or goes and the
// processes learn of it a round apart, so for that round the shares add up
// to more than the limit; and work rarely spreads evenly, so a process with
// nothing to do would sit on its share. The store holds the one count.
//
// A single process on PostgreSQL goes the same way, since another may join
// at any moment and the limits must hold then too: switching from counts
// in memory to counts in the store would leave a round in which both
// count. Its concurrency costs a statement only when it takes or gives
// back slots, its rate about ten a second while it sends (and two a second
// idle: the tokens a look for items took, and their return).

const (
	// rateTrip is the least of the rate a process takes per statement
	// (when it wants as many): a tenth of a second's worth.
	rateTrip = 100 * time.Millisecond
	// slotRetry is how long a process waits before it tries again to take
	// concurrency slots, after a try found fewer free than it asked.
	slotRetry = 500 * time.Millisecond
	// slotLinger is how long a process keeps slots it does not use once
	// its leases found nothing to send, before it gives them back. Idle,
	// it takes one slot to look for items with: a slot goes and comes
	// back once per slotLinger at most.
	slotLinger = 10 * time.Second
)

// sharedRoom is admit's count of the limits on a shared store: how many
// items the dispatcher may lease by the concurrency's slots, n at most
// (-1: no bound), and when none (no slot free, or the rate's next batch of
// tokens not yet there) how long to wait at most. The tokens themselves
// are taken by takeTokens, once the workers have room.
func (d *Delivery) sharedRoom(ctx context.Context, inbox string, ep *endpoint, fl *flow, n int) (int, time.Duration) {
	fl.trips.Lock()
	defer fl.trips.Unlock()
	if !ep.rate.IsZero() { // the rate's next batch cannot be there yet: wait without asking
		fl.mu.Lock()
		at := fl.tokensAt
		fl.mu.Unlock()
		if wait := time.Until(at); wait > 0 {
			return 0, wait
		}
	}
	if ep.concurrency == 0 { // no limit (any more): the slots go back
		fl.mu.Lock()
		held := fl.slots
		fl.slots = nil
		fl.mu.Unlock()
		d.giveSlots(ctx, inbox, held)
		return n, 0
	}
	c := d.cluster
	if !c.holds() {
		fl.mu.Lock()
		held := fl.slots
		fl.slots = nil
		fl.mu.Unlock()
		if len(held) > 0 {
			d.log.Warn("delivery: this node's lease may have ended; it drops its concurrency slots of the endpoint and starts no attempt until it renews",
				"inbox", inbox, "node", c.node, "slots", len(held))
			// Given back too, so that, should the lease not have ended
			// after all, the others need not wait for this node to take
			// them again. Should the store not answer, its lease ends and
			// they are free anyway.
			d.giveSlots(ctx, inbox, held)
		}
		return 0, time.Second
	}
	now := time.Now()
	fl.mu.Lock()
	var beyond []int // slots above a lowered limit
	fl.slots = slices.DeleteFunc(fl.slots, func(s int) bool {
		if s > ep.concurrency {
			beyond = append(beyond, s)
			return true
		}
		return false
	})
	held, room, retry, idle := len(fl.slots), len(fl.slots)-fl.inflight, fl.slotsTry, !fl.idleSince.IsZero()
	fl.mu.Unlock()
	d.giveSlots(ctx, inbox, beyond)

	live := int(max(c.live.Load(), 1))
	want := min(ep.concurrency, (ep.concurrency+live-1)/live) // its share first
	switch {
	case idle: // the last lease found nothing: one slot to look with
		want = min(held+max(1-room, 0), ep.concurrency)
	case held >= want:
		want = ep.concurrency // then any left free
	}
	if held < want && (room <= 0 || n < 0 || room < n) && !now.Before(retry) {
		got, err := d.takeSlots(ctx, inbox, fl, ep.concurrency, want-held)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("delivery: taking concurrency slots of an endpoint failed; retrying", "inbox", inbox, "err", err)
		}
		if got < want-held {
			fl.mu.Lock()
			fl.slotsTry = now.Add(slotRetry)
			fl.mu.Unlock()
			retry = now.Add(slotRetry)
		}
		room += got
	}
	if room <= 0 {
		return 0, min(max(retry.Sub(now), 10*time.Millisecond), time.Second)
	}
	if n < 0 || room < n {
		n = room
	}
	return n, 0
}

// takeSlots takes up to k free slots of inbox's endpoint, of 1 to
// concurrency, for this process, and returns how many it took. A slot is
// free when nobody holds it, when its holder's node lease ended, or when
// this process holds it in the store but not in fl.slots (it dropped it
// when its lease could have ended). It takes none unless this process's
// own node lease is live.
func (d *Delivery) takeSlots(ctx context.Context, inbox string, fl *flow, concurrency, k int) (int, error) {
	fl.mu.Lock()
	mine := slices.Clone(fl.slots)
	fl.mu.Unlock()
	if mine == nil {
		mine = []int{}
	}
	rows, err := d.db.QueryContext(ctx, `WITH free AS (
			SELECT s FROM generate_series(1, ?2::int) AS s
			WHERE s <> ALL(?5::int[]) AND NOT EXISTS (
				SELECT 1 FROM endpoint_slots e JOIN delivery_leases l ON l.name = 'node:' || e.holder
				WHERE e.inbox_id = ?1 AND e.slot = s AND e.holder <> ?3 AND l.expires_at > clock_timestamp())
			ORDER BY s LIMIT ?4)
		INSERT INTO endpoint_slots (inbox_id, slot, holder, taken_at)
		SELECT ?1, s, ?3, clock_timestamp() FROM free
		WHERE EXISTS (SELECT 1 FROM delivery_leases WHERE name = 'node:' || ?3 AND expires_at > clock_timestamp())
		ON CONFLICT (inbox_id, slot) DO UPDATE SET holder = excluded.holder, taken_at = excluded.taken_at
		WHERE endpoint_slots.holder = excluded.holder OR NOT EXISTS (
			SELECT 1 FROM delivery_leases l WHERE l.name = 'node:' || endpoint_slots.holder AND l.expires_at > clock_timestamp())
		RETURNING slot`, inbox, concurrency, d.cluster.holder, k, mine)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var got []int
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			return 0, err
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	took := 0
	for _, s := range got {
		if !slices.Contains(fl.slots, s) {
			fl.slots = append(fl.slots, s)
			took++
		}
	}
	slices.Sort(fl.slots)
	return took, nil
}

// giveSlots gives back slots of inbox's endpoint that this process held
// (and no longer lists in its flow). Should it fail, the others see them
// held until this process takes them again or its lease ends.
func (d *Delivery) giveSlots(ctx context.Context, inbox string, slots []int) {
	if len(slots) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := d.db.ExecContext(ctx, `DELETE FROM endpoint_slots WHERE inbox_id = ?1 AND holder = ?2 AND slot = ANY(?3::int[])`,
		inbox, d.cluster.holder, slots); err != nil {
		d.log.Warn("delivery: giving back concurrency slots of an endpoint failed; the other nodes take them when this node does not renew its lease",
			"inbox", inbox, "slots", len(slots), "err", err)
	}
}

// takeTokens takes up to k tokens of the rate of inbox's endpoint from
// the bucket in the shared store, for the items the dispatcher is about
// to lease. It returns how many it took and, when none, how long to wait
// before asking again. It takes none unless at least min(k, a tenth of a
// second's worth) are there, so that tokens go in batches, and a try
// that takes none writes nothing. After a batch, fl.tokensAt says when
// the next can be there: sharedRoom waits for it without asking.
func (d *Delivery) takeTokens(ctx context.Context, inbox string, ep *endpoint, fl *flow, k int) (int, time.Duration) {
	burst, per := ep.rate.burst(), ep.rate.perSecond()
	batch := min(float64(k), max(1, min(burst, math.Floor(per*rateTrip.Seconds()))))
	var got, avail float64
	for range 2 {
		err := d.db.QueryRowContext(ctx, `WITH b AS (
				SELECT inbox_id, n.at,
					least(?2::float8, tokens + greatest(0, extract(epoch FROM n.at - refilled_at)::float8) * ?3::float8) AS avail
				FROM endpoint_rates CROSS JOIN LATERAL (SELECT clock_timestamp() AS at) n
				WHERE inbox_id = ?1 FOR UPDATE OF endpoint_rates),
			g AS (SELECT b.*, CASE WHEN floor(b.avail) >= ?5::float8 THEN least(?4::float8, floor(b.avail)) ELSE 0 END AS got FROM b),
			u AS (UPDATE endpoint_rates r SET tokens = g.avail - g.got, refilled_at = greatest(r.refilled_at, g.at)
				FROM g WHERE r.inbox_id = g.inbox_id AND g.got > 0)
			SELECT got, avail FROM g`, inbox, burst, per, float64(k), batch).Scan(&got, &avail)
		if errors.Is(err, sql.ErrNoRows) { // the endpoint's first tokens: a full bucket
			_, err = d.db.ExecContext(ctx, `INSERT INTO endpoint_rates (inbox_id, tokens, refilled_at) VALUES (?1, ?2, clock_timestamp())
				ON CONFLICT (inbox_id) DO NOTHING`, inbox, burst)
			if err == nil {
				continue
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("delivery: taking tokens of an endpoint's rate failed; retrying", "inbox", inbox, "err", err)
			}
			return 0, retryDelay
		}
		break
	}
	if got < 1 {
		return 0, max(time.Duration((batch-avail)/per*float64(time.Second)), time.Millisecond)
	}
	if left := avail - got; left < batch {
		fl.mu.Lock()
		fl.tokensAt = time.Now().Add(time.Duration((batch - left) / per * float64(time.Second)))
		fl.mu.Unlock()
	}
	return int(got), 0
}

// giveTokens puts back n tokens of inbox's endpoint's rate that a lease
// found no items for.
func (d *Delivery) giveTokens(ctx context.Context, inbox string, ep *endpoint, n int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := d.db.ExecContext(ctx, `UPDATE endpoint_rates SET tokens = least(?2::float8, tokens + ?3::float8) WHERE inbox_id = ?1`,
		inbox, ep.rate.burst(), float64(n)); err != nil {
		d.log.Warn("delivery: giving back tokens of an endpoint's rate failed; the rate is lower for a moment", "inbox", inbox, "err", err)
	}
}

// leased follows a lease of items for ep's inbox that took tokens of its
// rate from the shared store: the tokens it found no items for go back,
// and slots unused since its leases found nothing for slotLinger go back.
func (d *Delivery) leased(ctx context.Context, inbox string, ep *endpoint, fl *flow, tokens, items int) {
	if d.cluster == nil {
		return
	}
	if tokens > items {
		d.giveTokens(ctx, inbox, ep, tokens-items)
	}
	fl.trips.Lock()
	defer fl.trips.Unlock()
	fl.mu.Lock()
	if items > 0 {
		fl.idleSince = time.Time{}
		fl.mu.Unlock()
		return
	}
	now := time.Now()
	if fl.idleSince.IsZero() {
		fl.idleSince = now
	}
	var spare []int
	if now.Sub(fl.idleSince) >= slotLinger {
		if k := len(fl.slots) - max(fl.inflight, 0); k > 0 {
			spare = slices.Clone(fl.slots[len(fl.slots)-k:])
			fl.slots = fl.slots[:len(fl.slots)-k]
		}
	}
	fl.mu.Unlock()
	d.giveSlots(ctx, inbox, spare)
}
