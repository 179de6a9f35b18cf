package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/retry"
)

// Handler handles one inbox item. It returns nil when it is done with
// the item (the runner acks it) and an error when the attempt failed (the
// runner nacks it with the error as its last error). The error says when
// to try again, with package retry's markers:
//
//   - a plain error, or retry.Transient(err): after RunnerConfig.Backoff;
//   - retry.RetryAfter(d, err): after d at least;
//   - retry.Permanent(err): never: the item is a dead letter at once.
//
// The server dead-letters an item after its last attempt (serve's
// --max-attempts). A transient error counts an attempt all the same: the
// attempt was counted when the item was leased. Handlers must be idempotent: an item is handled at
// least once (item.EventID is the same on every attempt). ctx ends when
// the runner's shutdown timeout passes or the item's lease is lost
// (context.Cause is then ErrLeaseLost): stop and return.
type Handler func(ctx context.Context, item api.Item) error

// RunnerConfig shape a Runner. Zero fields are the documented defaults.
type RunnerConfig struct {
	// Concurrency bounds the handlers running at once. Defaults to 10.
	Concurrency int
	// Batch bounds the items of one lease. Defaults to Concurrency (at
	// most 1000).
	Batch int
	// VisibilityTimeout is how long a lease holds its items; the runner
	// extends the lease of a job still running every Heartbeat, so a job
	// may run longer. Defaults to 30s.
	VisibilityTimeout time.Duration
	// Heartbeat is how often the lease of a running job is extended.
	// Defaults to a third of VisibilityTimeout; it must be below it.
	Heartbeat time.Duration
	// Wait is how long a lease waits for an item when none is ready (the
	// long poll). Defaults to 20s; at most 1m.
	Wait time.Duration
	// Backoff is the wait before the next attempt of an item whose
	// handler failed, by the item's attempts so far. Defaults to 1s
	// doubling up to 5m, full jitter.
	Backoff retry.Backoff
	// ShutdownTimeout is how long Run lets running handlers finish once
	// its context ends; then their contexts end and what they return is
	// acked or nacked. Defaults to VisibilityTimeout.
	ShutdownTimeout time.Duration
	// Logger logs the runner's failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// Defaults of RunnerConfig.
const (
	DefaultRunnerConcurrency = 10
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultRunnerWait        = 20 * time.Second
)

// DefaultRunnerBackoff is RunnerConfig.Backoff's default.
var DefaultRunnerBackoff = retry.Backoff{Base: time.Second, Max: 5 * time.Minute}

// maxReason is the most the server keeps of a nack's reason.
const maxReason = 1024

// Runner runs a handler over the items of one inbox: it leases batches,
// calls the handler with bounded concurrency, extends the leases of jobs
// that run long, and acks or nacks each item by what the handler
// returned. A handler that panics fails its attempt (the panic is the
// nack's reason).
//
// Run returns when its context ends: it stops leasing, lets running
// handlers finish (for up to ShutdownTimeout, their leases extended
// meanwhile), acks or nacks what they return, and returns. An item whose
// handler was cut off is nacked without delay, so another runner takes
// it at once; an item leased and not yet started is nacked the same way.
// A lease request the shutdown cuts off may have leased items whose
// answer never came: they wait for their visibility timeout.
type Runner struct {
	c     *API
	inbox string
	cfg   RunnerConfig
	log   *slog.Logger
}

// Inbox returns a runner of inbox's items; Run starts it.
func (c *API) Inbox(inbox string, cfg RunnerConfig) *Runner {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultRunnerConcurrency
	}
	if cfg.Batch <= 0 {
		cfg.Batch = cfg.Concurrency
	}
	cfg.Batch = min(cfg.Batch, 1000)
	if cfg.VisibilityTimeout <= 0 {
		cfg.VisibilityTimeout = DefaultVisibilityTimeout
	}
	if cfg.Heartbeat <= 0 || cfg.Heartbeat >= cfg.VisibilityTimeout {
		cfg.Heartbeat = cfg.VisibilityTimeout / 3
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultRunnerWait
	}
	cfg.Wait = min(cfg.Wait, time.Minute)
	if cfg.Backoff == (retry.Backoff{}) {
		cfg.Backoff = DefaultRunnerBackoff
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = cfg.VisibilityTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Runner{c: c, inbox: inbox, cfg: cfg, log: log.With("inbox", inbox)}
}

// ack is an item to ack under its lease.
type ack struct {
	lease string
	id    int64
}

// Run handles the inbox's items with h until ctx ends (then it returns
// nil once every leased item is acked or nacked). It returns an error
// when the server refuses the runner for good: a wrong token, or an
// inbox name it does not accept.
func (r *Runner) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return errors.New("client: Run: no handler")
	}
	// Handlers, acks and nacks outlive ctx by the shutdown timeout.
	jobsCtx, stopJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJobs()
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, stopJobs)
		context.AfterFunc(jobsCtx, func() { t.Stop() })
	})
	defer stopAfter()

	acks := make(chan ack, 4*r.cfg.Concurrency)
	var acker sync.WaitGroup
	acker.Go(func() { r.ackLoop(acks) })
	defer func() {
		close(acks)
		acker.Wait()
	}()

	slots := make(chan struct{}, r.cfg.Concurrency)
	var jobs sync.WaitGroup
	defer jobs.Wait()
	wait := retry.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		// Lease as many items as there are free slots (one at least).
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := r.takeSlots(ctx, slots)
		l, err := r.c.Lease(ctx, r.inbox, LeaseOptions{Max: free, VisibilityTimeout: r.cfg.VisibilityTimeout, Wait: r.cfg.Wait})
		if err != nil {
			for range free {
				<-slots
			}
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrInvalid) {
				return fmt.Errorf("client: lease from %s: %w", r.inbox, err)
			}
			d := wait.Delay(failures)
			failures++
			r.log.Warn("client: lease failed; trying again", "err", err, "after", d)
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		failures = 0
		for range free - len(l.Items) {
			<-slots
		}
		for _, it := range l.Items {
			jobs.Go(func() {
				defer func() { <-slots }()
				r.job(ctx, jobsCtx, h, l.Lease, it, acks)
			})
		}
	}
	return nil
}

// linger is how long a lease waits for half a batch of free slots once
// one is free: fewer, larger leases when handlers are quick (each lease
// is a write on the server), a short wait when they are slow.
const linger = 2 * time.Millisecond

// takeSlots takes, beside the one taken, the free slots up to a batch,
// waiting up to linger for half of one, and returns how many it holds.
func (r *Runner) takeSlots(ctx context.Context, slots chan<- struct{}) int {
	free := 1
	for free < r.cfg.Batch {
		select {
		case slots <- struct{}{}:
			free++
			continue
		default:
		}
		break
	}
	if free*2 >= r.cfg.Batch {
		return free
	}
	t := time.NewTimer(linger)
	defer t.Stop()
	for free*2 < r.cfg.Batch {
		select {
		case slots <- struct{}{}:
			free++
		case <-t.C:
			return free
		case <-ctx.Done():
			return free
		}
	}
	return free
}

// job runs h on it, extending its lease while h runs, and acks (through
// acks) or nacks it.
func (r *Runner) job(runCtx, jobsCtx context.Context, h Handler, lease string, it api.Item, acks chan<- ack) {
	if runCtx.Err() != nil { // leased as shutdown began: give it back
		r.nack(jobsCtx, lease, it, NackOptions{Reason: "not started: the runner stopped"})
		return
	}
	ctx, cancel := context.WithCancelCause(jobsCtx)
	defer cancel(nil)
	var (
		mu   sync.Mutex // guards beat and done
		beat *time.Timer
		done bool
	)
	var heartbeat func()
	heartbeat = func() {
		ext, err := r.c.Extend(jobsCtx, r.inbox, lease, r.cfg.VisibilityTimeout, it.ID)
		if err == nil && len(ext.Items) == 1 {
			err = ResultErr(ext.Items[0])
		}
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) {
			r.log.Warn("client: lost the lease of a running item; its handler is told to stop", "id", it.ID, "event_id", it.EventID, "err", err)
			cancel(ErrLeaseLost)
			return
		}
		if err != nil {
			r.log.Warn("client: extending a lease failed; trying again", "id", it.ID, "err", err)
		}
		beat = time.AfterFunc(r.cfg.Heartbeat, heartbeat)
	}
	mu.Lock()
	beat = time.AfterFunc(r.cfg.Heartbeat, heartbeat)
	mu.Unlock()

	err := r.call(ctx, h, it)

	mu.Lock()
	done = true
	beat.Stop()
	mu.Unlock()
	if context.Cause(ctx) == ErrLeaseLost {
		return // not ours to settle any more
	}
	if err == nil {
		acks <- ack{lease: lease, id: it.ID}
		return
	}
	o := retry.Classify(err)
	delay := max(r.cfg.Backoff.Delay(it.Attempts-1), o.After)
	switch {
	case o.Permanent:
		r.log.Warn("client: handler failed for good; nacked as a dead letter", "id", it.ID, "event_id", it.EventID, "attempts", it.Attempts, "err", err)
		r.nack(jobsCtx, lease, it, NackOptions{Dead: true, Reason: err.Error()})
		return
	case jobsCtx.Err() != nil: // cut off by the shutdown: give it back at once
		delay = 0
	}
	r.log.Info("client: handler failed; nacked", "id", it.ID, "event_id", it.EventID, "attempts", it.Attempts, "err", err, "retry_in", delay)
	r.nack(jobsCtx, lease, it, NackOptions{Delay: delay, Reason: err.Error()})
}

// call runs h, turning a panic into an error.
func (r *Runner) call(ctx context.Context, h Handler, it api.Item) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("client: handler panicked", "id", it.ID, "event_id", it.EventID, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return h(ctx, it)
}

// nack nacks it as o says.
func (r *Runner) nack(ctx context.Context, lease string, it api.Item, o NackOptions) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.timeout)
	defer cancel()
	o.Delay, o.Reason = min(o.Delay, 24*time.Hour), cleanReason(o.Reason)
	res, err := r.c.Nack(ctx, r.inbox, lease, o, it.ID)
	if err == nil && len(res) == 1 {
		err = ResultErr(res[0])
	}
	if err != nil {
		r.log.Warn("client: nack failed; the item is attempted again when its lease ends", "id", it.ID, "err", err)
	}
}

// ackLoop acks what arrives on acks, as few requests as it can: it takes
// every ack waiting, one request per lease, until acks is closed.
func (r *Runner) ackLoop(acks <-chan ack) {
	for a := range acks {
		byLease := map[string][]int64{a.lease: {a.id}}
		n := 1
	drain:
		for n < 1000 {
			select {
			case b, ok := <-acks:
				if !ok {
					break drain
				}
				byLease[b.lease] = append(byLease[b.lease], b.id)
				n++
			default:
				break drain
			}
		}
		for lease, ids := range byLease {
			r.ack(lease, ids)
		}
	}
}

// ack acks ids under lease, logging those the server did not ack.
func (r *Runner) ack(lease string, ids []int64) {
	ctx, cancel := context.WithTimeout(context.Background(), r.c.timeout)
	defer cancel()
	res, err := r.c.Ack(ctx, r.inbox, lease, ids...)
	if err != nil {
		r.log.Warn("client: ack failed; the items are attempted again when their lease ends", "items", len(ids), "err", err)
		return
	}
	for _, x := range res {
		if err := ResultErr(x); err != nil {
			r.log.Warn("client: ack refused; the item is attempted again", "id", x.ID, "err", err)
		}
	}
}

// cleanReason makes s a reason the server takes: no control characters,
// at most maxReason bytes.
func cleanReason(s string) string {
	s = strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= maxReason {
		return s
	}
	s = s[:maxReason-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
