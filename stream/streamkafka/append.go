package streamkafka

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox/stream"
)

// scanMargin is how far before a claim the takeover's scan starts: the
// claim's time is the index's clock, a record's timestamp the claimer's.
const scanMargin = time.Minute

// appendCall is the state of one Append.
type appendCall struct {
	st      *streamState
	events  []stream.Event
	recs    []*kgo.Record
	hashes  [][]byte
	results []stream.AppendResult
	token   string // the current round's claim token
}

// Append implements stream.Backend in the three steps of the package
// doc: claim, produce, settle. An identity held by another Append's live
// claim is waited for after the rest of the call is produced and
// settled, so that the call holds no claim while it waits.
func (b *Backend) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return nil, err
	}
	c := &appendCall{st: st, events: events, recs: make([]*kgo.Record, len(events)), hashes: make([][]byte, len(events)),
		results: make([]stream.AppendResult, len(events))}
	if len(events) == 0 {
		return c.results, nil
	}
	first := make(map[identity]int, len(events))
	dupOf := make([]int, len(events))
	pending := make([]int, 0, len(events))
	for i := range events {
		ev := &events[i]
		dupOf[i] = -1
		id := identity{ev.NativeID, ev.Variant}
		if j, ok := first[id]; ok {
			if err := stream.Conflict(&events[j], ev); err != nil {
				c.results[i].Err = err
			} else {
				dupOf[i] = j
			}
			continue
		}
		first[id] = i
		c.recs[i] = record(st.topic, ev, time.Time{})
		if n := recordSize(c.recs[i]); n > b.cfg.MaxRecordBytes {
			c.results[i].Err = fmt.Errorf("%w: %s takes up to %d bytes as a record batch, over MaxRecordBytes %d",
				stream.ErrTooLarge, ev.NativeID, n, b.cfg.MaxRecordBytes)
			continue
		}
		c.hashes[i] = payloadHash(ev.Payload)
		pending = append(pending, i)
	}

	deadline := time.Now().Add(2*b.cfg.ClaimTimeout + 5*time.Second)
	backoff := 5 * time.Millisecond
	for round := 0; len(pending) > 0; round++ {
		if round > 0 {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("append to %s: %s is still claimed by another append", streamID, events[pending[0]].NativeID)
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("append to %s: waiting for a claim: %w", streamID, ctx.Err())
			case <-b.closed:
				return nil, fmt.Errorf("append to %s: the backend is closed", streamID)
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		}
		if pending, err = b.appendRound(ctx, c, pending); err != nil {
			return nil, err
		}
	}
	for i, j := range dupOf {
		if j >= 0 {
			c.results[i] = c.results[j]
			c.results[i].Duplicate = c.results[j].Err == nil
		}
	}
	return c.results, nil
}

// takeover is an expired claim this Append took over.
type takeover struct {
	i         int
	claimedAt int64 // the old claim's, unix microseconds
}

// appendRound claims what it can of pending, produces it, settles it,
// and returns the events held by another Append's live claim.
func (b *Backend) appendRound(ctx context.Context, c *appendCall, pending []int) (wait []int, err error) {
	c.token = newToken() // a round's own: its settle is keyed by it
	var produce []int
	var taken []takeover
	// Rows are claimed in identity order, so that two transactions
	// claiming overlapping identities on PostgreSQL lock them in the same
	// order and never deadlock; they are produced in the call's order.
	pending = slices.Clone(pending)
	slices.SortFunc(pending, func(x, y int) int {
		return cmp.Or(strings.Compare(c.events[x].NativeID, c.events[y].NativeID), strings.Compare(c.events[x].Variant, c.events[y].Variant))
	})
	ids := make([]identity, len(pending))
	for k, i := range pending {
		ids[k] = identity{c.events[i].NativeID, c.events[i].Variant}
	}
	// The claim inserts a row for every identity first: in the common
	// case, all new, that is the whole transaction. When it could not
	// insert them all, it reads the rows: those of its own token it
	// inserted.
	err = b.idx.tx(ctx, func(tx *sql.Tx) error {
		produce, taken, wait = produce[:0], taken[:0], wait[:0]
		reqs := make([]claimRequest, len(pending))
		for k, i := range pending {
			reqs[k] = claimRequest{identity: ids[k], typ: c.events[i].Type, hash: c.hashes[i], pos: i}
		}
		n, err := b.idx.insertClaims(ctx, tx, c.st.id, c.token, b.cfg.ClaimTimeout, reqs)
		if err != nil {
			return err
		}
		if n == len(pending) {
			produce = append(produce, pending...)
			return nil
		}
		rows, err := b.idx.rows(ctx, tx, c.st.id, ids)
		if err != nil {
			return err
		}
		for k, i := range pending {
			r, ok := rows[ids[k]]
			switch {
			case ok && r.token == c.token:
				produce = append(produce, i)
			case !ok: // deleted meanwhile (a refused claim, a trim): try again
				wait = append(wait, i)
			case r.stored():
				c.resolveStored(i, r)
			case r.expired():
				ok, err := b.idx.takeOver(ctx, tx, c.st.id, c.token, b.cfg.ClaimTimeout, reqs[k], r.token)
				if err != nil {
					return err
				}
				if ok {
					taken = append(taken, takeover{i: i, claimedAt: r.claimedAt})
				} else {
					wait = append(wait, i)
				}
			default:
				wait = append(wait, i)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("append to %s: claim: %w", c.st.id, err)
	}
	var done []settled
	if len(taken) > 0 {
		found, err := b.resolveTakeovers(ctx, c, taken)
		if err != nil {
			return nil, err
		}
		for _, t := range taken {
			if s, ok := found[t.i]; ok {
				done = append(done, s)
			} else {
				produce = append(produce, t.i)
			}
		}
	}
	slices.Sort(produce)
	if len(produce) > 0 && b.beforeProduce != nil {
		if err := b.beforeProduce(); err != nil {
			return nil, err
		}
	}
	produced, prodErr := b.produce(ctx, c, produce)
	done = append(done, produced...)
	if len(done) > 0 {
		if b.beforeSettle != nil {
			if err := b.beforeSettle(); err != nil {
				return nil, err
			}
		}
		if err := b.idx.settle(ctx, c.st.id, c.token, done, prodErr == nil); err != nil {
			// Kafka holds the events: the results stand, and the rows
			// are resolved by whoever meets their expired claims.
			b.log.Error("streamkafka: settle failed after Kafka acknowledged; the claims will be resolved when they expire",
				"stream", c.st.id, "events", len(done), "err", err)
		}
	}
	if prodErr != nil {
		return nil, prodErr
	}
	return wait, nil
}

// resolveStored fills result i from the row of its identity, stored.
func (c *appendCall) resolveStored(i int, r *idRow) {
	ev := &c.events[i]
	switch {
	case r.typ != ev.Type:
		c.results[i] = stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldType}}
	case string(r.hash) != string(c.hashes[i]):
		c.results[i] = stream.AppendResult{Err: &stream.ConflictError{Field: stream.FieldPayload}}
	default:
		c.results[i] = stream.AppendResult{Offset: r.offset, StoredAt: r.storedAt, Duplicate: true}
	}
}

// resolveTakeovers looks in the topic for the records of the claims
// taken over, from a minute before the earliest claim to the end, and
// returns what to settle for those it found (by event index).
func (b *Backend) resolveTakeovers(ctx context.Context, c *appendCall, taken []takeover) (map[int]settled, error) {
	since := taken[0].claimedAt
	want := make(map[identity]int, len(taken))
	for _, t := range taken {
		since = min(since, t.claimedAt)
		ev := &c.events[t.i]
		want[identity{ev.NativeID, ev.Variant}] = t.i
	}
	started := time.Now()
	found := map[int]settled{}
	err := b.scan(ctx, c.st, fromMicros(since).Add(-scanMargin), func(r *kgo.Record) bool {
		id := identity{string(r.Key), string(header(r, HeaderVariant))}
		i, ok := want[id]
		if !ok {
			return true
		}
		delete(want, id)
		stored := stream.Event{Type: string(header(r, HeaderType)), Payload: r.Value}
		s := settled{identity: id, offset: r.Offset + 1, storedAt: r.Timestamp, typ: stored.Type, hash: payloadHash(r.Value), pos: i, own: true}
		found[i] = s
		if err := stream.Conflict(&stored, &c.events[i]); err != nil {
			c.results[i] = stream.AppendResult{Err: err}
		} else {
			c.results[i] = stream.AppendResult{Offset: s.offset, StoredAt: r.Timestamp.UTC(), Duplicate: true}
		}
		return len(want) > 0
	})
	if err != nil {
		return nil, fmt.Errorf("append to %s: look for the records of expired claims: %w", c.st.id, err)
	}
	if len(want) > 0 && time.Since(started) > b.cfg.ClaimTimeout/4 {
		// The scan took a good part of the new claims: renew them so that
		// their records have the whole delivery timeout.
		ids := make([]identity, 0, len(want))
		for id := range want {
			ids = append(ids, id)
		}
		if err := b.idx.renew(ctx, c.st.id, c.token, b.cfg.ClaimTimeout, ids); err != nil {
			return nil, fmt.Errorf("append to %s: renew claims: %w", c.st.id, err)
		}
	}
	b.log.Info("streamkafka: took over expired claims", "stream", c.st.id, "claims", len(taken), "found", len(found))
	return found, nil
}

// produce produces the events of c at idxs, stamped under pubMu with a
// time that never goes back, and waits for every acknowledgement. It
// returns what to settle: the stored events, and the claims of events
// the broker refused as too large, to drop.
func (b *Backend) produce(ctx context.Context, c *appendCall, idxs []int) ([]settled, error) {
	if len(idxs) == 0 {
		return nil, nil
	}
	errs := make([]error, len(idxs))
	var wg sync.WaitGroup
	wg.Add(len(idxs))
	b.pubMu.Lock()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if now.Before(b.lastStamp) {
		now = b.lastStamp // the clock went back: stored times still never decrease
	}
	b.lastStamp = now
	for k, i := range idxs {
		r := c.recs[i]
		r.Timestamp = now
		b.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			errs[k] = err
			wg.Done()
		})
	}
	b.pubMu.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// The claims stay until they expire: a record still in flight
		// may be stored yet.
		return nil, fmt.Errorf("append to %s: waiting for acks: %w", c.st.id, ctx.Err())
	}
	out := make([]settled, 0, len(idxs))
	var firstErr error
	failed := 0
	top := int64(0)
	for k, i := range idxs {
		r, ev := c.recs[i], &c.events[i]
		id := identity{ev.NativeID, ev.Variant}
		switch err := errs[k]; {
		case err == nil:
			c.results[i] = stream.AppendResult{Offset: r.Offset + 1, StoredAt: r.Timestamp.UTC()}
			out = append(out, settled{identity: id, offset: r.Offset + 1, storedAt: r.Timestamp, pos: i})
			top = max(top, r.Offset+1)
		case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
			// Refused, so not stored: its claim goes.
			c.results[i] = stream.AppendResult{Err: fmt.Errorf("%w: %s: %v", stream.ErrTooLarge, ev.NativeID, err)}
			out = append(out, settled{identity: id, pos: i})
		default:
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if top > 0 {
		c.st.grow(top)
	}
	if failed > 0 {
		return out, fmt.Errorf("append to %s: %d of %d events not acknowledged: %w", c.st.id, failed, len(idxs), firstErr)
	}
	return out, nil
}
