package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/forwarded"
	"github.com/postbox-events/postbox/internal/netpolicy"
	"github.com/postbox-events/postbox/internal/replyto"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/retry"
)

// Handler handles one inbox item in the process (a worker calls it). A nil
// error completes the item. An error is a failed attempt: the item is
// retried with backoff until its last attempt, then it is failed (a dead
// letter). The retry package's markers say more: retry.Permanent
// dead-letters the item at once, retry.Transient retries it without
// counting the attempt, and retry.RetryAfter makes the next attempt wait
// at least its duration, but no longer than the longest retry wait of the
// inbox (its endpoint's RetryMaxDelay or longest scheduled wait, else
// Config.RetryMaxDelay), so that no answer can park an item for a year.
// ctx ends after Config.HandlerTimeout, or when the server stops (the
// item is then handed back, and the attempt is not counted).
type Handler func(ctx context.Context, it *Item) error

// Handle registers h as the handler of inbox: the workers lease its items
// and complete them with h. It replaces the target URL of the inbox's
// subscription, if any. A nil h unregisters it.
func (d *Delivery) Handle(inbox string, h Handler) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h == nil {
		delete(d.handlers, inbox)
	} else {
		d.handlers[inbox] = h
	}
	d.dispatchLocked(inbox)
}

// handlerLocked returns the handler of inbox: the registered one, else
// the target URL of its subscription the workers post to, else neither.
func (d *Delivery) handlerLocked(inbox string) (Handler, string) {
	if h := d.handlers[inbox]; h != nil {
		return h, ""
	}
	return nil, d.targets[inbox]
}

// dispatchLocked starts or stops the dispatcher of inbox after its
// handler changed. d.mu is held.
func (d *Delivery) dispatchLocked(inbox string) {
	if l := d.dispatchers[inbox]; l != nil {
		l.cancel() // a new one takes the new handler; Run waits for this one at its end
		d.replaced = append(slices.DeleteFunc(d.replaced, (*loop).ended), l)
		delete(d.dispatchers, inbox)
	}
	h, target := d.handlerLocked(inbox)
	if (h == nil && target == "") || d.runCtx == nil || d.stopped {
		return
	}
	ctx, cancel := context.WithCancel(d.runCtx)
	l := &loop{cancel: cancel, done: make(chan struct{})}
	d.dispatchers[inbox] = l
	go func() {
		defer close(l.done)
		d.dispatch(ctx, inbox, h, target)
	}()
}

// ended reports whether the loop has returned.
func (l *loop) ended() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// job is one leased item for a worker: for h, or for the endpoint ep.
type job struct {
	inbox, lease string
	expires      time.Time // the lease's end
	timeout      time.Duration
	item         Item
	h            Handler
	ep           *endpoint
	fl           *flow // ep's flow control; nil for h
	probe        bool  // the probe of ep's open breaker
}

// dispatch leases the items of inbox as workers become free and hands them
// to the workers, for h or for the endpoint of target, until ctx ends.
//
// Leasing and handing out are two goroutines: a lease is a write
// transaction, waiting for a commit, and while it waits the workers
// take the items of the leases before it (those the slots hold) from the
// feeder. Run one after the other, the workers went idle during every
// lease once they had handled what the last one took.
func (d *Delivery) dispatch(ctx context.Context, inbox string, h Handler, target string) {
	// At most one lease per slot is waiting for the feeder: sending never
	// blocks.
	leased := make(chan batch, d.slots.size)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		d.feed(ctx, leased)
	}()
	defer func() {
		close(leased)
		<-fed
	}()
	for ctx.Err() == nil {
		changed := d.inboxes.channel(inbox) // before looking, so no wake-up is missed
		var ep *endpoint
		var fl *flow
		timeout, maxAttempts := d.cfg.HandlerTimeout, d.cfg.MaxAttempts
		if target != "" {
			var err error
			if ep, err = d.endpoint(ctx, inbox, target); err != nil {
				if ctx.Err() == nil {
					d.log.Error("delivery: reading the endpoint failed; retrying", "inbox", inbox, "err", err)
					sleep(ctx, retryDelay)
				}
				continue
			}
			timeout, maxAttempts = ep.timeout, ep.maxAttempts
			fl = d.flow(inbox)
		}
		// A leased item may wait for a worker, and its handler may take
		// its timeout: the lease outlasts both, unless the workers are
		// slow enough that the item waits longer than its handler's
		// timeout and 10 seconds; the worker then hands it back.
		visibility := 2*timeout + 10*time.Second
		most, probe := cleanupBatch, false
		// Paused, or at a limit: wait for an attempt's end, a change or
		// the time.
		pause := func(wait time.Duration) {
			t := time.NewTimer(min(wait, time.Second))
			select {
			case <-fl.freed:
			case <-changed:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
			d.cfg.testSignals.roundEnded(inbox, 0)
		}
		if fl != nil {
			allowed, p, wait := d.admit(ctx, inbox, ep, fl)
			if allowed == 0 {
				pause(wait)
				continue
			}
			if allowed > 0 {
				most = min(most, allowed)
			}
			probe = p
		}
		n := d.slots.acquire(ctx, min(d.cfg.Workers, most), most)
		if n == 0 {
			return
		}
		tokens := 0 // of the rate, taken from a shared store
		if fl != nil && d.cluster != nil && !ep.rate.IsZero() {
			got, wait := d.takeTokens(ctx, inbox, ep, fl, n)
			if got == 0 {
				d.slots.release(n)
				pause(wait)
				continue
			}
			d.slots.release(n - got)
			n, tokens = got, got
		}
		l, err := d.lease(ctx, inbox, n, visibility, maxAttempts)
		d.slots.release(n - len(l.Items))
		if fl != nil {
			d.leased(ctx, inbox, ep, fl, tokens, len(l.Items))
		}
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error("delivery: lease for workers failed; retrying", "inbox", inbox, "err", err)
				sleep(ctx, retryDelay)
			}
			continue
		}
		if fl != nil && len(l.Items) > 0 {
			if probe && !d.claimProbe(ctx, inbox, ep, fl) { // another process probes
				d.slots.release(len(l.Items))
				d.handBack(inbox, l.Token, l.Items)
				d.cfg.testSignals.roundEnded(inbox, len(l.Items))
				continue
			}
			fl.took(len(l.Items), ep)
		}
		if len(l.Items) > 0 {
			b := batch{job: job{inbox: inbox, lease: l.Token, expires: l.ExpiresAt, timeout: timeout, h: h, ep: ep, fl: fl, probe: probe},
				items: l.Items}
			if ep != nil && !ep.rate.IsZero() {
				// A rate takes its tokens at the lease: the next lease waits
				// until the workers took this one's items, so that items
				// waiting for a worker do not go out in a bunch with the next
				// lease's.
				b.taken = make(chan struct{})
			}
			d.cfg.testSignals.roundEnded(inbox, len(l.Items)) // before a worker can take them
			leased <- b
			if b.taken != nil {
				select {
				case <-b.taken:
				case <-ctx.Done():
				}
			}
			continue
		}
		// Items due later (a retry's backoff) wake no one but a wait
		// shorter than idleLook (the worker that failed the attempt wakes
		// the dispatcher when it ends): look again every idleLook.
		t := time.NewTimer(idleLook)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		d.cfg.testSignals.roundEnded(inbox, 0)
	}
}

// idleLook is how often the dispatcher of an inbox with nothing to
// lease looks again for items come due.
const idleLook = time.Second

// batch is the items of one lease for the feeder, and what their jobs
// share.
type batch struct {
	job   job // without its item
	items []Item
	taken chan struct{} // when not nil, closed once the workers took the items, or the feeder stopped
}

// feed hands the items of the leases from leased to the workers, in
// order, until leased is closed. Once ctx ended it hands back, to
// pending, every item no worker took.
func (d *Delivery) feed(ctx context.Context, leased <-chan batch) {
	for b := range leased {
		for i, it := range b.items {
			j := b.job
			j.item = it
			select {
			case d.jobs <- j:
				continue
			case <-ctx.Done():
			}
			d.untake(b, i) // stopping: hand back what no worker took
			for b := range leased {
				d.untake(b, 0)
			}
			return
		}
		if b.taken != nil {
			close(b.taken)
		}
	}
}

// untake hands back the items of b from the i-th on, which no worker took.
func (d *Delivery) untake(b batch, i int) {
	n := len(b.items) - i
	d.slots.release(n)
	b.job.fl.release(n)
	d.handBack(b.job.inbox, b.job.lease, b.items[i:])
}

// slotsPerWorker is how many items the workers hold per worker: those
// being handled and those leased and waiting for a worker.
//
// A lease is a write, whose commit every lease and ack waits for: with
// 2·Workers items held, the items in the hands of the workers and the
// feeders ran out while one lease waited for its commit, and the workers
// idled. With more held, the next lease commits while the workers still
// have items, and each commit (one lease, one ack of a batch) carries
// more items. An item that waits long enough for its lease to end before
// its handler's timeout is handed back, not attempted (see work).
const slotsPerWorker = 8

// slots counts the items the workers hold, at most
// slotsPerWorker·Workers. A lease waits until Workers of them are free,
// so that under load it takes a batch of Workers items or more, not one
// at a time (each lease is a write); idle, it takes what there is at
// once.
type slots struct {
	size  int // slots in all
	mu    sync.Mutex
	free  int
	freed chan struct{} // signalled when slots are released
}

func newSlots(n int) *slots { return &slots{size: n, free: n, freed: make(chan struct{}, 1)} }

// acquire waits until at least atLeast slots are free and takes them all
// (at most most). It returns how many, 0 when ctx ended.
func (s *slots) acquire(ctx context.Context, atLeast, most int) int {
	for {
		s.mu.Lock()
		if s.free >= atLeast {
			n := min(s.free, most)
			s.free -= n
			s.mu.Unlock()
			return n
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
		case <-ctx.Done():
			return 0
		}
	}
}

func (s *slots) release(n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// work runs jobs until ctx ends, their attempts in actx (draining).
func (d *Delivery) work(ctx, actx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-d.jobs:
			if d.now().Add(j.timeout).After(j.expires) {
				// It waited for a worker so long that its lease could end
				// during the attempt: another lease would then take it
				// while this one is still at work on it.
				d.handBack(j.inbox, j.lease, []Item{j.item})
				d.inboxes.notify(j.inbox)
			} else {
				d.attempt(actx, j)
			}
			d.slots.release(1)
			j.fl.release(1)
		}
	}
}

// draining returns a context that ends grace after ctx does, and its
// cancel: Run's, for the attempts of its workers (Config.DrainGrace).
func draining(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return dctx, func() { stop(); cancel() }
}

// attempt runs one attempt of a job in actx (Run's draining context) and
// settles its item, recording the attempt of an endpoint in the same
// transaction.
func (d *Delivery) attempt(actx context.Context, j job) {
	d.logSampled("delivery: processing", j)
	start := time.Now()
	timeout, limit, maxAttempts := d.cfg.HandlerTimeout, d.cfg.RetryMaxDelay, d.cfg.MaxAttempts
	if j.ep != nil {
		timeout, limit, maxAttempts = j.ep.timeout, j.ep.most, j.ep.maxAttempts
	}
	hctx, cancel := context.WithTimeout(actx, timeout)
	var rec *Attempt
	var err error
	if j.ep != nil {
		rec, err = d.sendTraced(hctx, j.ep, &j.item)
	} else {
		err = call(hctx, j.h, &j.item)
	}
	cancel()
	took := time.Since(start)
	if err != nil && actx.Err() != nil { // stopping, past the drain: not the handler's failure
		d.handBack(j.inbox, j.lease, []Item{j.item})
		return
	}
	ctx := context.WithoutCancel(actx) // an attempt that ended while stopping is recorded all the same
	if j.fl != nil {
		d.observe(ctx, j, rec, err)
	}
	if rec != nil {
		rec.Latency = took
		if err != nil {
			rec.Error = truncate(err.Error(), 1000)
		}
	}
	if err == nil { // the acker acks a batch of completions in one transaction
		d.completions <- completion{inbox: j.inbox, lease: j.lease, id: j.item.ID, attempts: j.item.Attempts, took: took, rec: rec,
			event: eventRef{j.item.Stream, j.item.EventID, j.item.Type, j.item.Offset}, ordered: j.item.OrderKey != nil}
		return
	}
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer scancel()
	o := retry.Classify(err)
	f := failure{reason: truncate(err.Error(), 1000), maxAttempts: maxAttempts, log: recs(rec), dead: o.Permanent}
	wait := o.After
	if wait > limit {
		d.log.Debug("delivery: Retry-After beyond the retry max delay; waiting the max", "inbox", j.inbox, "item", j.item.ID,
			"retry_after", wait, "max", limit)
		wait = limit
	}
	delay := d.backoff(d.cfg.RetryBaseDelay, limit, wait)
	if j.ep != nil {
		delay = d.delay(j.ep, wait)
	}
	var next time.Duration // the wait the settle chose
	f.delay = func(attempts int) time.Duration {
		next = delay(attempts)
		return next
	}
	var res []Result
	var serr error
	if o.Transient && !o.Permanent {
		res, serr = d.failUncounted(sctx, j.inbox, []int64{j.item.ID}, j.lease, f)
	} else {
		res, serr = d.fail(sctx, j.inbox, []int64{j.item.ID}, j.lease, f)
	}
	if serr == nil && next > 0 && next < idleLook {
		// The dispatcher looks for items due later only every idleLook:
		// a shorter wait wakes it when it ends.
		time.AfterFunc(next, func() { d.inboxes.notify(j.inbox) })
	}
	d.attempted(j, res, serr, err, took)
}

func recs(rec *Attempt) []Attempt {
	if rec == nil {
		return nil
	}
	return []Attempt{*rec}
}

// jobAttrs are the attributes of the log lines of j's attempt: the
// event's identity (its source, id, type and offset), the item and the
// attempt.
func jobAttrs(j job) []any {
	return []any{"inbox", j.inbox, "item", j.item.ID, "attempt", j.item.Attempts,
		"source", j.item.Stream, "event_id", j.item.EventID, "type", j.item.Type, "offset", j.item.Offset}
}

// logSampled logs msg of j at INFO, at most 10 lines of msg a second; the
// next line that goes out says in skipped how many were left out.
func (d *Delivery) logSampled(msg string, j job, kv ...any) {
	if !d.log.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	ok, skipped := d.sample.Allow(msg)
	if !ok {
		return
	}
	at := append(jobAttrs(j), kv...)
	if skipped > 0 {
		at = append(at, "skipped", skipped)
	}
	d.log.Info(msg, at...)
}

// attempted records the outcome of an attempt once its item is settled.
func (d *Delivery) attempted(j job, res []Result, serr, err error, took time.Duration) {
	at := jobAttrs(j)
	switch {
	case serr != nil:
		d.log.Error("delivery: recording the attempt failed; the item is retried when its lease expires", append(at, "err", serr)...)
		return
	case res[0].Err != nil:
		d.log.Warn("delivery: the attempt outlasted its lease; the item was handed out again", append(at, "err", res[0].Err, "took", took)...)
		return
	}
	d.cfg.Metrics.attempted(j.inbox, res[0].State, took)
	switch res[0].State {
	case StateCompleted:
		d.logSampled("delivery: completed", j, "took", took)
	case StatePending:
		d.log.Info("delivery: attempt failed; retry scheduled", append(at, "err", err, "took", took)...)
	case StateFailed:
		d.log.Error("delivery: attempt failed; the item is a dead letter", append(at, "err", err)...)
	}
}

// completion is a worker's item whose attempt succeeded, for the acker.
type completion struct {
	inbox, lease string
	id           int64
	attempts     int
	took         time.Duration
	rec          *Attempt // the endpoint's attempt to record; nil: none
	event        eventRef // for the log
	ordered      bool     // the item has an order key: its ack frees the key's next item
}

// eventRef is the identity of an item's event, for the log lines of its
// attempts.
type eventRef struct {
	stream, id, typ string
	offset          int64
}

// job returns the job c completed, as far as attempted needs it.
func (c *completion) job() job {
	return job{inbox: c.inbox, lease: c.lease, item: Item{ID: c.id, Attempts: c.attempts,
		Stream: c.event.stream, EventID: c.event.id, Type: c.event.typ, Offset: c.event.offset}}
}

// ackQueue is how many completions per worker may wait for the acker:
// as many as the items the workers hold, so that a worker never waits
// for the acker while it has items.
const ackQueue = slotsPerWorker

// ack acks the items the workers completed, a batch of those waiting at a
// time in one transaction, until completions is closed: PostgreSQL
// commits a few large transactions much faster than many small ones, and
// on SQLite, where the single writer folds concurrent acks into one
// commit anyway, one writer function for a batch runs a few statements
// where one per item ran as many (each parsed anew by the driver: a
// quarter of the CPU of a delivery when every worker acked its own). A
// worker hands its item over and takes the next job; should the process
// stop before the ack commits, the item is attempted again after its
// lease.
func (d *Delivery) ack(completions <-chan completion) {
	for c := range completions {
		batch := []completion{c}
	more:
		for len(batch) < ackQueue*d.cfg.Workers {
			select {
			case c, ok := <-completions:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		d.ackBatch(batch)
	}
}

// ackBatch acks a batch of completions: in one transaction, those whose
// items still hold their lease with one statement (completeHeld), their
// attempts with another and the kept counts with a third, whatever the
// inboxes and leases of the batch; the others (acked already, a lease
// lost) then settle the long way, which says why.
func (d *Delivery) ackBatch(batch []completion) {
	type group struct{ inbox, lease string }
	defer d.freeKeys(batch) // once every item of the batch settled
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nowText := d.now().UTC().Format(sqlitedb.Time)
	// An item twice in the batch (attempted under two leases, the first
	// outlasted) settles the long way: the statement does not say which
	// lease completed it.
	seen := make(map[int64]int, len(batch))
	for _, c := range batch {
		seen[c.id]++
	}
	var once []completion
	var onceAt, left []int
	for i, c := range batch {
		if seen[c.id] == 1 {
			once, onceAt = append(once, c), append(onceAt, i)
		} else {
			left = append(left, i)
		}
	}
	fast := make([]bool, len(batch))
	var slow []int
	err := d.update(ctx, func(tx conn) error {
		t := tally{}
		var err error
		if slow, err = completeHeld(ctx, tx, nowText, once, t); err != nil {
			return err
		}
		return t.write(ctx, d, tx)
	})
	if err != nil { // all settle the long way
		left = left[:0]
		for i := range batch {
			left = append(left, i)
		}
	} else {
		for _, i := range onceAt {
			fast[i] = true
		}
		for _, i := range slow {
			fast[onceAt[i]] = false
			left = append(left, onceAt[i])
		}
	}
	for i, c := range batch {
		if fast[i] {
			d.cfg.Metrics.settled(c.inbox, StateCompleted, 1)
			jb := c.job()
			d.attempted(jb, []Result{{ID: c.id, State: StateCompleted}}, nil, nil, c.took)
		}
	}
	if len(left) == 0 {
		return
	}
	groups := map[group][]completion{}
	for _, i := range left {
		c := batch[i]
		g := group{c.inbox, c.lease}
		groups[g] = append(groups[g], c)
	}
	var sts []*settlement
	var waiting [][]completion
	for g, cs := range groups {
		ids := make([]int64, len(cs))
		var log []Attempt
		for i, c := range cs {
			ids[i] = c.id
			if c.rec != nil {
				log = append(log, *c.rec)
			}
		}
		sts = append(sts, &settlement{inbox: g.inbox, ids: ids, lease: g.lease, to: StateCompleted, apply: complete(ctx), log: log})
		waiting = append(waiting, cs)
	}
	err = d.settleAll(ctx, sts...)
	for i, cs := range waiting {
		for j, c := range cs {
			jb := c.job()
			if err != nil {
				d.attempted(jb, nil, fmt.Errorf("ack items of %s: %w", c.inbox, err), nil, c.took)
			} else {
				d.attempted(jb, sts[i].results[j:j+1], nil, nil, c.took)
			}
		}
	}
}

// freeKeys wakes the dispatchers of the inboxes of a batch's items that
// have an order key: the next item of each key may go now, and nothing
// else tells a dispatcher that found none free.
func (d *Delivery) freeKeys(batch []completion) {
	var last string
	for _, c := range batch {
		if c.ordered && c.inbox != last {
			d.inboxes.notify(c.inbox)
			last = c.inbox
		}
	}
}

// call runs h, turning a panic into an error.
func call(ctx context.Context, h Handler, it *Item) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, it)
}

// handBack returns items leased but not handled (the server is stopping)
// to pending, due now, without counting the attempt.
func (d *Delivery) handBack(inbox, lease string, items []Item) {
	ids := make([]int64, len(items))
	for i := range items {
		ids[i] = items[i].ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := d.settle(ctx, inbox, ids, lease, StatePending, func(tx conn, now string, moves []move) error {
		return execIn(ctx, tx, `UPDATE inbox_items SET state = 'pending', attempts = CASE WHEN attempts > 0 THEN attempts - 1 ELSE 0 END, lease_token = NULL,
			lease_expires_at = NULL, updated_at = ?1, next_attempt_at = ?1 WHERE item_id IN (%s)`, moves, now)
	})
	if err != nil {
		d.log.Warn("delivery: handing back unhandled items failed; they return when their lease expires or at the next start",
			"inbox", inbox, "items", len(ids), "err", err)
	}
}

// backoff returns the wait before the next attempt of an item that has
// had attempts attempts: the n-th retry waits min(base·2^(n-1),
// maxDelay), less a random part of it set by Config.Jitter, and at least
// atLeast. maxDelay (an endpoint's, else Config.RetryMaxDelay) also bounds
// a Retry-After before it comes here.
func (d *Delivery) backoff(base, maxDelay, atLeast time.Duration) func(attempts int) time.Duration {
	b := retry.Backoff{Base: base, Max: maxDelay, Jitter: d.cfg.Jitter}
	return func(attempts int) time.Duration {
		return max(b.Delay(attempts-1), atLeast)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// idempotencyKey is what a target may skip a redelivery by: a webhook's
// idempotency key, or for a device event its identity (device_id,
// event_id) as "device/event_id", the device escaped so that no two
// identities give one key ("a/b" + "c" against "a" + "b/c"). Two devices
// may use one event_id; a target that dedupes on the key must not skip
// one device's event for another's.
func idempotencyKey(device, eventID string) string {
	if device == "" {
		return eventID
	}
	return url.PathEscape(device) + "/" + eventID
}

// excerptSize is how much of a target's answer an attempt records.
const excerptSize = 1024

// deliveryHandle is the value of api.HeaderDeliveryHandle for an item whose
// stored handle is handle, of the device deviceID's session sessionID
// (read from its metadata) when it is a device's: its handle compact
// (replyto.Of) and in ASCII (what is not, and DEL, as \u escapes: a header
// value holds no DEL, and receivers read other bytes as Latin-1); "" for
// none, and for one over maxHandleHeader bytes (many servers refuse a
// request whose headers are over 8 KiB).
func deliveryHandle(handle json.RawMessage, deviceID, sessionID string) string {
	if len(handle) > 0 && !bytes.Equal(handle, []byte("null")) {
		var c bytes.Buffer
		if json.Compact(&c, handle) != nil {
			return ""
		}
		v := asciiJSON(c.Bytes())
		if len(v) > maxHandleHeader {
			return ""
		}
		return v
	}
	if deviceID != "" {
		return asciiJSON(replyto.Device(deviceID, sessionID))
	}
	return ""
}

// maxHandleHeader bounds the X-Postbox-Delivery-Handle header a push
// carries; a larger handle is left out (the item, pulled, shows it).
const maxHandleHeader = 4096

// asciiJSON returns compact JSON b with every rune that is not printable
// ASCII (in a string: outside one there is none) written as a \u escape,
// a pair of them beyond the BMP.
func asciiJSON(b []byte) string {
	plain := true
	for _, c := range b {
		if c >= 0x7f {
			plain = false
			break
		}
	}
	if plain {
		return string(b)
	}
	out := make([]byte, 0, len(b)+32)
	for _, r := range string(b) {
		switch {
		case r < 0x7f:
			out = append(out, byte(r))
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
	}
	return string(out)
}

// send POSTs an item's payload to ep's URL and returns the attempt to
// record: 2xx completes the item; any other status, a timeout or a
// refused connection is a failed attempt; 410 Gone dead-letters it;
// Retry-After is honoured up to the endpoint's retry max delay (see
// RetryAfter). The request carries the event's identity in headers
// (Idempotency-Key: the source's id of the event, so the target can skip
// what it has done), the headers a webhook arrived with, the endpoint's
// headers and, when it has secrets, a Standard Webhooks signature:
// webhook-id (item_ID, the same at every attempt), webhook-timestamp (this
// attempt's) and webhook-signature (one per live secret).
func (d *Delivery) send(ctx context.Context, ep *endpoint, it *Item) (*Attempt, error) {
	now := d.now()
	rec := &Attempt{Item: it.ID, Number: it.Attempts, At: now.UTC().Truncate(time.Microsecond), URL: ep.url}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.url, bytes.NewReader(it.Payload))
	if err != nil {
		return rec, retry.Permanent(fmt.Errorf("target %s: %w", ep.url, err))
	}
	var meta struct {
		Headers   map[string]string `json:"headers"`
		DeviceID  string            `json:"device_id"`
		SessionID string            `json:"session_id"`
	}
	if json.Unmarshal(it.Metadata, &meta) == nil {
		for name, value := range meta.Headers {
			if forwarded.Header(name) {
				req.Header.Set(name, value)
			}
		}
	}
	h := req.Header
	for name, values := range ep.headers {
		h[name] = values
	}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "postbox")
	h.Set("Idempotency-Key", idempotencyKey(meta.DeviceID, it.EventID))
	h.Set("X-Event-Type", it.Type)
	h.Set("X-Postbox-Event", it.StreamEventID)
	h.Set("X-Postbox-Subscription", it.Subscription)
	h.Set("X-Postbox-Item", strconv.FormatInt(it.ID, 10))
	h.Set("X-Postbox-Attempt", strconv.Itoa(it.Attempts))
	h.Set("X-Postbox-Occurred-At", it.OccurredAt.UTC().Format(time.RFC3339Nano))
	if it.SourceSequence != nil {
		h.Set("X-Postbox-Source-Sequence", strconv.FormatInt(*it.SourceSequence, 10))
	}
	if handle := deliveryHandle(it.DeliveryHandle, meta.DeviceID, meta.SessionID); handle != "" {
		h.Set(api.HeaderDeliveryHandle, handle)
	}
	setTrace(ctx, h, it.Metadata) // trace.go
	if ep.format == FormatCloudEvents {
		setCloudEvent(h, it) // cloudevents.go
	}
	id := "item_" + strconv.FormatInt(it.ID, 10)
	if it.ID == 0 { // a test event (SendTest): its own id
		id = it.EventID
	}
	sign(h, ep.keys, id, now, it.Payload)
	return d.exchange(req, rec)
}

// sign sets the Standard Webhooks headers of a request with body: webhook-id
// id, webhook-timestamp now, and a webhook-signature by each of keys (none:
// no headers).
func sign(h http.Header, keys [][]byte, id string, now time.Time, body []byte) {
	if len(keys) == 0 {
		return
	}
	sigs := make([]string, len(keys))
	for i, key := range keys {
		sigs[i] = stdwebhook.Sign(key, id, now, body)
	}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", strings.Join(sigs, " "))
}

// exchange sends req to rec.URL and records the answer in rec: 2xx is a
// success; any other status, a timeout or a refused connection is a
// failed attempt, 410 Gone a permanent one (retry.Permanent), and a
// Retry-After asks for a wait (retry.RetryAfter).
func (d *Delivery) exchange(req *http.Request, rec *Attempt) (*Attempt, error) {
	resp, err := d.cfg.HTTPClient.Do(req)
	var refused *netpolicy.RefusedError
	if errors.As(err, &refused) { // the target address policy
		if host := req.URL.Hostname(); host != refused.Addr.String() {
			return rec, fmt.Errorf("%s: %w", host, refused)
		}
		return rec, refused
	}
	if err != nil {
		return rec, err
	}
	defer resp.Body.Close()
	rec.Status = resp.StatusCode
	body, _ := io.ReadAll(io.LimitReader(resp.Body, excerptSize))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // so the connection is reused
	if len(body) > 0 {
		rec.Excerpt = strings.ReplaceAll(strings.ToValidUTF8(string(body), "\uFFFD"), "\x00", "\uFFFD")
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return rec, nil
	}
	err = fmt.Errorf("%s answered %s", rec.URL, resp.Status)
	if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
		err = fmt.Errorf("%w, a redirect to %s, which postbox does not follow: make that the target", err, truncate(loc, 300))
	}
	if b := strings.TrimSpace(truncate(string(body), 300)); b != "" {
		err = fmt.Errorf("%w: %s", err, b)
	}
	if resp.StatusCode == http.StatusGone {
		return rec, retry.Permanent(err)
	}
	// The workers bound the wait, and log when they cut it.
	if wait, ok := retry.ParseRetryAfter(resp.Header.Get("Retry-After"), rec.At, math.MaxInt64); ok && wait > 0 {
		return rec, retry.RetryAfter(wait, err)
	}
	return rec, err
}
