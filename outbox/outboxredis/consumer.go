package outboxredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/retry"
)

// Defaults of ConsumerConfig.
const (
	DefaultBatch         = 100
	DefaultBlock         = time.Second
	DefaultMinIdle       = 30 * time.Second
	DefaultMaxDeliveries = 10
	DefaultStart         = "0"
	// DeadStreamSuffix names a stream's dead-letter stream: "orders" →
	// "orders:dead".
	DeadStreamSuffix = ":dead"
)

// Handler handles one event. Returning nil acknowledges the entry;
// returning an error leaves it pending, to be delivered again after
// MinIdle, and dead-lettered after MaxDeliveries. A panic is an error.
// The retry package's markers say more: retry.Permanent dead-letters the
// entry at once; retry.Transient does not count the delivery (below);
// retry.RetryAfter(d, err) pauses the consumer's reads and claims for at
// least d (at most 30s), so that the entry, and every other, waits that
// long before its next delivery.
//
// After a handler error a Consumer pauses reading and claiming, for longer
// after each error in a row (a jittered 100ms, doubling up to 30s), until
// a handler call succeeds: an outage of what the handler writes to (its
// database) slows the consumer down instead of spending the deliveries of
// every pending entry each MinIdle. It still spends them, only more
// slowly (an entry is not claimed again before MinIdle, and each pause
// lets one claimed entry fail), unless the handler marks the outage's
// errors retry.Transient.
type Handler func(ctx context.Context, m Message) error

// ConsumerConfig configures a Consumer. Zero fields take their defaults.
type ConsumerConfig struct {
	// Stream is the key of the stream read. Required.
	Stream string
	// Group is the consumer group; each group gets every entry. Required.
	Group string
	// Consumer names this consumer within the group. Give each process a
	// name that survives its restarts (a pod name): on start a Consumer
	// first handles the entries still pending under its own name, at once;
	// those of a name that never comes back wait MinIdle for XAUTOCLAIM.
	// Defaults to hostname-pid.
	Consumer string
	// Handler handles each event. Required.
	Handler Handler
	// Batch bounds the new entries of one read (COUNT). Entries already
	// delivered once (this consumer's own pending entries after a restart,
	// and those it claims) are read one at a time instead, so that an entry
	// that crashes the process every time is the only one charged a
	// delivery for each crash, and is dead-lettered alone. Defaults to 100.
	Batch int
	// Block is how long one read waits for new entries. Run notices the end
	// of its context between reads, so it returns up to Block after it
	// (go-redis does not interrupt a blocked read unless the client has
	// ContextTimeoutEnabled). Defaults to 1s.
	Block time.Duration
	// MinIdle is how long an entry stays pending before it is delivered
	// again (XAUTOCLAIM min-idle-time): the retry delay after a handler
	// error, and how soon the entries of a consumer that died are taken
	// over. A consumer working through a batch renews its claim on the
	// rest of the batch every MinIdle/2, so a batch may take longer than
	// MinIdle; but one handler call must stay well under MinIdle/2, or its
	// entry (and the rest of its batch) is claimed and handled by another
	// consumer while the first still works on it. Defaults to 30s.
	MinIdle time.Duration
	// ClaimInterval is how often pending entries idle for MinIdle are
	// claimed. Defaults to MinIdle/2.
	ClaimInterval time.Duration
	// MaxDeliveries dead-letters an entry: one the handler refused on its
	// MaxDeliveries-th delivery, or one delivered more often than that
	// (its consumers died while handling it), is moved to DeadStream with
	// the reason and acknowledged. Deliveries that ended in a retry.Transient
	// error do not count. Defaults to 10.
	MaxDeliveries int
	// DeadStream is where dead letters go. Defaults to Stream +
	// DeadStreamSuffix. In a Redis Cluster the two keys may live on other
	// nodes; a hash tag ("{orders}" and "{orders}:dead") keeps them
	// together, but nothing here needs that.
	DeadStream string
	// Start is where a group created by Run begins: "0" (every entry the
	// stream holds, so that the events a relay appended before the group's
	// first consumer started are handled too) or "$" (only the entries
	// appended from now on). It does not move an existing group, and a
	// group lost with its stream (NOGROUP) is created again at "0" whatever
	// Start says. Defaults to "0".
	Start string
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Consumer handles a stream's entries as one consumer of a group.
type Consumer struct {
	client redis.UniversalClient
	cfg    ConsumerConfig
	log    *slog.Logger
	wait   func(ctx context.Context, d time.Duration) // Run's pauses: sleep, but for tests
}

// NewConsumer returns a Consumer of cfg.Stream through client.
func NewConsumer(client redis.UniversalClient, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, errors.New("outboxredis: consumer needs a client")
	case cfg.Stream == "":
		return nil, errors.New("outboxredis: consumer needs a stream")
	case cfg.Group == "":
		return nil, errors.New("outboxredis: consumer needs a group")
	case cfg.Handler == nil:
		return nil, errors.New("outboxredis: consumer needs a handler")
	case cfg.Batch < 0 || cfg.Block < 0 || cfg.MinIdle < 0 || cfg.ClaimInterval < 0 || cfg.MaxDeliveries < 0:
		return nil, errors.New("outboxredis: Batch, Block, MinIdle, ClaimInterval and MaxDeliveries must not be negative")
	}
	if cfg.Consumer == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "consumer"
		}
		cfg.Consumer = host + "-" + strconv.Itoa(os.Getpid())
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Block == 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.Block < time.Millisecond {
		cfg.Block = time.Millisecond // BLOCK 0 would wait for ever
	}
	if cfg.MinIdle == 0 {
		cfg.MinIdle = DefaultMinIdle
	}
	if cfg.ClaimInterval == 0 {
		cfg.ClaimInterval = max(cfg.MinIdle/2, time.Millisecond)
	}
	if cfg.MaxDeliveries == 0 {
		cfg.MaxDeliveries = DefaultMaxDeliveries
	}
	if cfg.DeadStream == "" {
		cfg.DeadStream = cfg.Stream + DeadStreamSuffix
	}
	if cfg.DeadStream == cfg.Stream {
		return nil, errors.New("outboxredis: DeadStream must not be Stream")
	}
	if cfg.Start == "" {
		cfg.Start = DefaultStart
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With("stream", cfg.Stream, "group", cfg.Group, "consumer", cfg.Consumer)
	return &Consumer{client: client, cfg: cfg, log: log, wait: sleep}, nil
}

// Name returns the consumer's name in its group.
func (c *Consumer) Name() string { return c.cfg.Consumer }

// pace paces Run after a Redis error, and after handler errors in a row;
// its Max also bounds a handler's retry.RetryAfter.
var pace = retry.Backoff{Base: 100 * time.Millisecond, Max: 30 * time.Second}

// streak is what the handler calls of a pass tell Run: the handler errors
// in a row, and the longest wait a retry.RetryAfter asked for since Run
// last paused.
type streak struct {
	n     int
	after time.Duration
}

// Run creates the group if it is missing, then handles entries until ctx
// ends: first those pending under this consumer's name (left by an earlier
// run), one at a time, then new ones, a batch at a time, and every
// ClaimInterval, one at a time, those pending for MinIdle under any name
// (handler errors, dead consumers).
//
// Redis errors are logged and retried with backoff, and so are handler
// errors: after one, Run pauses reading and claiming, for longer after
// each error in a row, until a handler call succeeds (see Handler). A
// group that disappears (NOGROUP: its stream was deleted or evicted, then
// created again by a relay's XADD) is logged as an error and created again
// at "0", so that the entries appended meanwhile are handled.
//
// Run returns nil when ctx ends, and an error only when the group cannot
// be created for a reason other than a transport failure or a server that
// takes no writes for now (the key holds something else, an ACL refuses
// it).
func (c *Consumer) Run(ctx context.Context) error {
	start := c.cfg.Start // where the group is created
	pending := "0"       // reading this consumer's own pending entries; "" when done
	claiming := ""       // the XAUTOCLAIM cursor of a claim pass; "" between passes
	var lastClaim time.Time
	created := false
	failures := 0 // Redis errors in a row
	var failing streak
	for ctx.Err() == nil {
		var err error
		wasFailing := failing.n
		switch {
		case !created:
			err = c.createGroup(ctx, start)
			if err == nil {
				created = true
			} else if refused(err) {
				return err
			}
		case pending != "":
			pending, err = c.readPending(ctx, pending, &failing)
		case claiming != "" || time.Since(lastClaim) >= c.cfg.ClaimInterval:
			if claiming == "" {
				claiming = "0-0"
			}
			claiming, err = c.claim(ctx, claiming, &failing)
			if err == nil && claiming == "" {
				lastClaim = time.Now()
			}
		default:
			block := min(c.cfg.Block, max(c.cfg.ClaimInterval-time.Since(lastClaim), time.Millisecond))
			err = c.readNew(ctx, block, &failing)
		}
		var pause time.Duration
		switch {
		case failing.n > wasFailing:
			pause = max(pace.Delay(failing.n-1), min(failing.after, pace.Max))
			failing.after = 0
			c.log.Warn("outboxredis: handler failed; pausing reads and claims", "failures", failing.n, "pause", pause.Round(time.Millisecond))
		case failing.n == 0 && wasFailing > 0:
			c.log.Info("outboxredis: handler succeeded again; resuming", "failures", wasFailing)
		}
		if err == nil {
			failures = 0
		} else if ctx.Err() == nil {
			if redis.HasErrorPrefix(err, "NOGROUP") {
				c.log.Error("outboxredis: the consumer group is gone (its stream was deleted or evicted, or the group destroyed); creating it again at the start of the stream", "err", err)
				created, start, pending, claiming = false, "0", "0", ""
			}
			delay := pace.Delay(failures)
			failures++
			c.log.Warn("outboxredis: consumer failed; retrying", "err", err, "pause", delay.Round(time.Millisecond), "failures", failures)
			pause = max(pause, delay)
		}
		if pause > 0 {
			c.wait(ctx, pause)
		}
	}
	return nil
}

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *Consumer) createGroup(ctx context.Context, start string) error {
	err := c.client.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, start).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		return fmt.Errorf("create group %s of %s: %w", c.cfg.Group, c.cfg.Stream, err)
	}
	return nil
}

// readPending handles the next of this consumer's own pending entries
// after cursor and returns the cursor for the next one, "" after the last.
// One at a time: the read counts a delivery of each entry it returns, and
// after a crash only the entry that crashed must be charged again.
func (c *Consumer) readPending(ctx context.Context, cursor string, failing *streak) (string, error) {
	readAt := time.Now()
	res, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Streams: []string{c.cfg.Stream, cursor},
		Count:   1, Block: -1,
	}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return cursor, fmt.Errorf("read own pending entries: %w", err)
	}
	var entries []redis.XMessage
	if len(res) > 0 {
		entries = res[0].Messages
	}
	if len(entries) == 0 {
		return "", nil
	}
	deliveries, err := c.deliveries(ctx, entries)
	if err != nil {
		return cursor, err
	}
	if cursor == "0" {
		c.log.Info("outboxredis: handling the entries left pending by an earlier run, one at a time")
	}
	if err := c.handle(ctx, entries, deliveries, readAt, failing); err != nil {
		return cursor, err // read it again
	}
	return entries[len(entries)-1].ID, nil
}

// readNew handles the entries no consumer of the group has seen yet,
// waiting up to block for some.
func (c *Consumer) readNew(ctx context.Context, block time.Duration, failing *streak) error {
	res, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Streams: []string{c.cfg.Stream, ">"},
		Count:   int64(c.cfg.Batch), Block: block,
	}).Result()
	// Redis delivers when it replies, which for a blocked read is at its
	// end: now, less the reply's time on the wire.
	readAt := time.Now()
	if errors.Is(err, redis.Nil) {
		return nil // nothing new within block
	}
	if err != nil {
		return fmt.Errorf("read new entries: %w", err)
	}
	if len(res) == 0 {
		return nil
	}
	return c.handle(ctx, res[0].Messages, nil, readAt, failing) // first deliveries
}

// claim takes over and handles the next entry pending for MinIdle under
// any consumer name, this one's included, scanning the group's pending
// entries from cursor, and returns the cursor to go on from, "" at the end
// of the pending list. One at a time, as in readPending: XAUTOCLAIM counts
// a delivery of each entry it claims.
func (c *Consumer) claim(ctx context.Context, cursor string, failing *streak) (string, error) {
	readAt := time.Now()
	entries, next, deleted, err := c.client.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		MinIdle: c.cfg.MinIdle, Start: cursor, Count: 1,
	}).Result()
	if err != nil {
		return cursor, fmt.Errorf("claim idle entries: %w", err)
	}
	if len(deleted) > 0 {
		// Redis dropped them from the pending list: trimmed (MaxLen)
		// or deleted before anyone handled them.
		c.log.Error("outboxredis: pending entries were deleted from the stream before they were handled; they are lost to this group", "entries", deleted)
	}
	if len(entries) > 0 {
		deliveries, err := c.deliveries(ctx, entries)
		if err != nil {
			return cursor, err
		}
		if err := c.handle(ctx, entries, deliveries, readAt, failing); err != nil {
			return cursor, err
		}
	}
	if next == "0-0" || next == "" {
		return "", nil
	}
	return next, nil
}

// deliveries reads the delivery counters of pending entries (XPENDING,
// one per entry, in one pipeline).
func (c *Consumer) deliveries(ctx context.Context, entries []redis.XMessage) (map[string]int, error) {
	pipe := c.client.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(entries))
	for i, e := range entries {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: c.cfg.Stream, Group: c.cfg.Group, Start: e.ID, End: e.ID, Count: 1})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read delivery counts: %w", err)
	}
	out := make(map[string]int, len(entries))
	for _, cmd := range cmds {
		for _, p := range cmd.Val() {
			out[p.ID] = int(p.RetryCount)
		}
	}
	return out, nil
}

// handle calls the handler for each entry, then acknowledges the entries
// handled (one XACK). deliveries nil means first deliveries. The end of
// ctx stops it between entries; the rest stay pending. failing counts the
// handler errors in a row: each error adds one, a success resets it; and
// keeps the longest retry.RetryAfter of the errors.
//
// The entries were delivered at readAt (or later), and another consumer
// may claim them once they are MinIdle old: after MinIdle/2 renew
// acknowledges the entries handled so far and claims the rest again, and
// if one handler call overran so that MinIdle passed, the rest of the
// batch is left alone, as another consumer may be handling it.
func (c *Consumer) handle(ctx context.Context, entries []redis.XMessage, deliveries map[string]int, readAt time.Time, failing *streak) error {
	// Acknowledging and dead-lettering finish work already done, so they
	// outlive ctx.
	wctx := context.WithoutCancel(ctx)
	var acks []string
	defer func() {
		if len(acks) > 0 {
			if err := c.client.XAck(wctx, c.cfg.Stream, c.cfg.Group, acks...).Err(); err != nil {
				c.log.Error("outboxredis: acknowledging handled entries failed; they will be handled again", "err", err, "entries", len(acks))
			}
		}
	}()
	leased := readAt
	for i, e := range entries {
		if ctx.Err() != nil {
			return nil
		}
		switch held := time.Since(leased); {
		case held >= c.cfg.MinIdle:
			c.log.Warn("outboxredis: a handler ran past MinIdle; the rest of its batch is left for a claim", "entries", len(entries)-i, "held", held.Round(time.Millisecond), "min_idle", c.cfg.MinIdle)
			return nil
		case held >= c.cfg.MinIdle/2:
			t := time.Now()
			if err := c.renew(wctx, acks, entries[i:]); err != nil {
				return err
			}
			acks, leased = acks[:0], t
		}
		n := 1
		if deliveries != nil {
			n = deliveries[e.ID] // 0: unknown
		}
		if e.Values == nil { // a pending entry deleted from the stream
			c.log.Error("outboxredis: a pending entry was deleted from the stream before it was handled; it is lost to this group", "entry_id", e.ID)
			acks = append(acks, e.ID)
			continue
		}
		m, err := parseEntry(e)
		if err != nil {
			if err := c.deadLetter(wctx, e, n, err.Error()); err != nil {
				return err
			}
			continue
		}
		m.Deliveries = n
		if n > c.cfg.MaxDeliveries {
			reason := fmt.Sprintf("delivered %d times, over MaxDeliveries %d, without an acknowledgement (its consumers stopped while handling it)", n, c.cfg.MaxDeliveries)
			if err := c.deadLetter(wctx, e, n, reason); err != nil {
				return err
			}
			continue
		}
		err = c.call(ctx, m)
		switch {
		case err == nil:
			acks = append(acks, e.ID)
			failing.n = 0
			continue
		case ctx.Err() != nil:
			return nil // stopped, not failed: the entry stays pending
		}
		o := retry.Classify(err)
		if !o.Permanent { // the entry's own fault: no reason to slow down
			failing.n++
			failing.after = max(failing.after, o.After)
		}
		switch {
		case o.Permanent:
			reason := fmt.Sprintf("handler failed permanently on delivery %d: %v", n, err)
			if err := c.deadLetter(wctx, e, n, reason); err != nil {
				return err
			}
		case o.Transient && n > 0:
			c.log.Warn("outboxredis: handler failed with a transient error; the entry stays pending and is delivered again after MinIdle, and the delivery does not count", "entry_id", e.ID, "event_id", m.EventID, "deliveries", n, "err", err)
			if err := c.uncount(wctx, e.ID, n-1); err != nil {
				return err
			}
		case n >= c.cfg.MaxDeliveries:
			reason := fmt.Sprintf("handler failed on delivery %d of %d: %v", n, c.cfg.MaxDeliveries, err)
			if err := c.deadLetter(wctx, e, n, reason); err != nil {
				return err
			}
		default:
			c.log.Warn("outboxredis: handler failed; the entry stays pending and is delivered again after MinIdle", "entry_id", e.ID, "event_id", m.EventID, "deliveries", n, "err", err)
		}
	}
	return nil
}

// renew acknowledges the entries handled (acks) and claims rest again
// (XCLAIM JUSTID: their idle time starts again, and no delivery is
// counted), in one round trip.
func (c *Consumer) renew(ctx context.Context, acks []string, rest []redis.XMessage) error {
	ids := make([]string, len(rest))
	for i, e := range rest {
		ids[i] = e.ID
	}
	pipe := c.client.Pipeline()
	if len(acks) > 0 {
		pipe.XAck(ctx, c.cfg.Stream, c.cfg.Group, acks...)
	}
	pipe.XClaimJustID(ctx, &redis.XClaimArgs{Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer, Messages: ids})
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("renew the claim on %d entries: %w", len(ids), err)
	}
	return nil
}

// uncount sets the delivery counter of a pending entry this consumer holds
// back to deliveries (XCLAIM RETRYCOUNT JUSTID: the claim itself counts no
// delivery, and the entry's idle time starts again).
func (c *Consumer) uncount(ctx context.Context, id string, deliveries int) error {
	err := c.client.Do(ctx, "xclaim", c.cfg.Stream, c.cfg.Group, c.cfg.Consumer, 0, id, "retrycount", deliveries, "justid").Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("set back the delivery counter of %s: %w", id, err)
	}
	return nil
}

// call runs the handler, turning a panic into an error.
func (c *Consumer) call(ctx context.Context, m Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
			c.log.Error("outboxredis: handler panicked", "entry_id", m.ID, "event_id", m.EventID, "panic", r, "stack", string(debug.Stack()))
		}
	}()
	return c.cfg.Handler(ctx, m)
}

// deadLetter appends e to the dead-letter stream with the reason, then
// acknowledges it. The two are not atomic: a failure between them leaves
// the entry pending, and it is dead-lettered again when next claimed.
func (c *Consumer) deadLetter(ctx context.Context, e redis.XMessage, deliveries int, reason string) error {
	values := sortedValues(e.Values)
	values = append(values,
		FieldDeadEntryID, e.ID,
		FieldDeadGroup, c.cfg.Group,
		FieldDeadConsumer, c.cfg.Consumer,
		FieldDeadReason, reason,
		FieldDeadDeliveries, deliveries,
		FieldDeadAt, time.Now().UTC().Format(time.RFC3339Nano),
	)
	if err := c.client.XAdd(ctx, &redis.XAddArgs{Stream: c.cfg.DeadStream, Values: values}).Err(); err != nil {
		return fmt.Errorf("dead-letter %s to %s: %w", e.ID, c.cfg.DeadStream, err)
	}
	if err := c.client.XAck(ctx, c.cfg.Stream, c.cfg.Group, e.ID).Err(); err != nil {
		return fmt.Errorf("acknowledge dead letter %s: %w", e.ID, err)
	}
	c.log.Warn("outboxredis: entry moved to the dead-letter stream", "entry_id", e.ID, "dead_stream", c.cfg.DeadStream, "reason", reason, "deliveries", deliveries)
	return nil
}
