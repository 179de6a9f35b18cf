package outboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox/outboxredis"
	"github.com/postbox-events/postbox/retry"
)

func newConsumer(t testing.TB, c redis.UniversalClient, cfg outboxredis.ConsumerConfig) *outboxredis.Consumer {
	t.Helper()
	if cfg.Block == 0 {
		cfg.Block = 50 * time.Millisecond
	}
	con, err := outboxredis.NewConsumer(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return con
}

func TestNewConsumerValidates(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	h := func(context.Context, outboxredis.Message) error { return nil }
	for name, cfg := range map[string]outboxredis.ConsumerConfig{
		"no stream":          {Group: "g", Handler: h},
		"no group":           {Stream: "s", Handler: h},
		"no handler":         {Stream: "s", Group: "g"},
		"negative batch":     {Stream: "s", Group: "g", Handler: h, Batch: -1},
		"negative min idle":  {Stream: "s", Group: "g", Handler: h, MinIdle: -time.Second},
		"negative max":       {Stream: "s", Group: "g", Handler: h, MaxDeliveries: -1},
		"dead stream=stream": {Stream: "s", Group: "g", Handler: h, DeadStream: "s"},
	} {
		if _, err := outboxredis.NewConsumer(c, cfg); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	con, err := outboxredis.NewConsumer(c, outboxredis.ConsumerConfig{Stream: "s", Group: "g", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	if con.Name() == "" || !strings.Contains(con.Name(), "-") {
		t.Errorf("default consumer name %q, want hostname-pid", con.Name())
	}
}

func TestConsumerHandlesAndAcknowledgesEveryEntry(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 250)
	msgs[3].TenantID = "tenant-3"
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)

	var rec recorder
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Batch: 32, Handler: rec.handle})
	runConsumer(t, con)
	testenv.Eventually(t, 10*time.Second, "every event handled", func() bool { return rec.distinct() == len(msgs) })
	testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })

	seen := rec.messages()
	if len(seen) != len(msgs) {
		t.Fatalf("handler called %d times for %d events", len(seen), len(msgs))
	}
	for i, m := range seen { // one consumer handles in stream order
		want := msgs[i]
		if m.EventID != want.EventID || m.Type != want.Type || string(m.Payload) != string(want.Body) ||
			m.CorrelationID != want.CorrelationID || m.TenantID != want.TenantID ||
			!m.CreatedAt.Equal(want.CreatedAt) || m.Deliveries != 1 || m.ID == "" {
			t.Fatalf("message %d = %+v, want %+v", i, m, want)
		}
	}
}

func TestConsumerRetriesAfterMinIdle(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 3)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)

	rec := recorder{fail: func(m outboxredis.Message, calls int) error {
		switch {
		case m.EventID == msgs[0].EventID && calls == 1:
			return errors.New("database is down")
		case m.EventID == msgs[1].EventID && calls == 1:
			panic("nil map") // a panic is an error, not a crash
		}
		return nil
	}}
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MinIdle: 100 * time.Millisecond, Handler: rec.handle})
	started := time.Now()
	runConsumer(t, con)
	testenv.Eventually(t, 10*time.Second, "the failed events handled again", func() bool {
		return rec.calls(msgs[0].EventID) == 2 && rec.calls(msgs[1].EventID) == 2
	})
	testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })
	if elapsed := time.Since(started); elapsed < 100*time.Millisecond {
		t.Errorf("retried after %s, before MinIdle", elapsed)
	}
	if n := rec.calls(msgs[2].EventID); n != 1 {
		t.Errorf("the event that succeeded was handled %d times", n)
	}
	calls := map[string]int{}
	for _, m := range rec.messages() {
		calls[m.EventID]++
		if m.Deliveries != calls[m.EventID] {
			t.Errorf("%s call %d: Deliveries %d", m.EventID, calls[m.EventID], m.Deliveries)
		}
	}
	if n, _ := c.XLen(context.Background(), stream+outboxredis.DeadStreamSuffix).Result(); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// A consumer that stops with entries pending: another consumer of the
// group claims them after MinIdle; the same consumer, restarted, handles
// its own at once.
func TestConsumerTakesOverPendingEntries(t *testing.T) {
	for _, sameName := range []bool{false, true} {
		t.Run(fmt.Sprintf("sameName=%v", sameName), func(t *testing.T) {
			c := newClient(t)
			stream := newStream(t, c)
			msgs := messages("evt", 20)
			publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)

			// The first consumer dies while handling its first entry: the
			// whole batch it read stays pending under its name.
			dying := make(chan struct{})
			first := newConsumer(t, c, outboxredis.ConsumerConfig{
				Stream: stream, Group: "g", Consumer: "first", Batch: 100, MinIdle: time.Hour,
				Handler: func(ctx context.Context, m outboxredis.Message) error {
					select {
					case <-dying:
					default:
						close(dying)
					}
					<-ctx.Done()
					return ctx.Err()
				},
			})
			stopFirst := runConsumer(t, first)
			<-dying
			if err := stopFirst(); err != nil {
				t.Fatal(err)
			}
			p, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100, Consumer: "first"}).Result()
			if err != nil || len(p) != len(msgs) {
				t.Fatalf("pending under first: %d, %v; want %d", len(p), err, len(msgs))
			}

			var rec recorder
			// second claims what first held for MinIdle: an hour ago.
			ids := make([]string, len(p))
			for i, e := range p {
				ids[i] = e.ID
			}
			backdate(t, c, stream, "g", "first", ids...)
			cfg := outboxredis.ConsumerConfig{Stream: stream, Group: "g", Consumer: "second", MinIdle: time.Minute, Handler: rec.handle}
			if sameName {
				cfg.Consumer, cfg.MinIdle = "first", time.Hour // its own pending list, before any claim
			}
			runConsumer(t, newConsumer(t, c, cfg))
			testenv.Eventually(t, 10*time.Second, "the pending entries handled", func() bool { return rec.distinct() == len(msgs) })
			testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })
			for _, m := range rec.messages() {
				if m.Deliveries != 2 {
					t.Errorf("%s: Deliveries %d, want 2 (one to first, one now)", m.EventID, m.Deliveries)
				}
			}
			if len(rec.messages()) != len(msgs) {
				t.Errorf("%d calls for %d events", len(rec.messages()), len(msgs))
			}
		})
	}
}

func TestConsumerDeadLettersAfterMaxDeliveries(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 2)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)
	poison := msgs[0].EventID

	rec := recorder{fail: func(m outboxredis.Message, calls int) error {
		if m.EventID == poison {
			return fmt.Errorf("cannot apply %s (call %d)", m.EventID, calls)
		}
		return nil
	}}
	// The test brings on each retry without waiting: once the handler has
	// failed, the entry is made idle for MinIdle (backdate) and the next
	// claim pass takes it. (A MinIdle as short as the retry delay, 30ms,
	// can be outlasted by the consumer's own round trips under load, and
	// the entry claimed again without a call, counted.)
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MinIdle: time.Minute, ClaimInterval: 10 * time.Millisecond, MaxDeliveries: 3, Handler: rec.handle})
	runConsumer(t, con)
	src, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for calls := 1; calls < 3; calls++ {
		testenv.Eventually(t, 10*time.Second, fmt.Sprintf("failed call %d", calls), func() bool { return rec.calls(poison) == calls })
		backdate(t, c, stream, "g", con.Name(), src[0].ID)
	}
	dead := stream + outboxredis.DeadStreamSuffix
	testenv.Eventually(t, 10*time.Second, "a dead letter", func() bool { n, _ := c.XLen(context.Background(), dead).Result(); return n == 1 })
	testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })

	if n := rec.calls(poison); n != 3 {
		t.Errorf("poison event handled %d times, want MaxDeliveries (3)", n)
	}
	entries, err := c.XRange(context.Background(), dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	v := entries[0].Values
	for k, want := range map[string]string{
		outboxredis.FieldEventID: poison, outboxredis.FieldPayload: string(msgs[0].Body),
		outboxredis.FieldDeadEntryID: src[0].ID, outboxredis.FieldDeadGroup: "g",
		outboxredis.FieldDeadConsumer: con.Name(), outboxredis.FieldDeadDeliveries: "3",
	} {
		if v[k] != want {
			t.Errorf("dead letter %s = %v, want %q", k, v[k], want)
		}
	}
	if r, _ := v[outboxredis.FieldDeadReason].(string); !strings.Contains(r, "cannot apply "+poison+" (call 3)") || !strings.Contains(r, "delivery 3 of 3") {
		t.Errorf("dead_reason %q does not carry the last error", r)
	}
	if _, err := time.Parse(time.RFC3339Nano, fmt.Sprint(v[outboxredis.FieldDeadAt])); err != nil {
		t.Errorf("dead_at: %v", err)
	}
	if rec.calls(msgs[1].EventID) != 1 {
		t.Errorf("the good event was handled %d times", rec.calls(msgs[1].EventID))
	}
}

// An entry delivered more than MaxDeliveries times without an answer (its
// consumers died handling it) is dead-lettered without calling the
// handler again.
func TestConsumerDeadLettersEntryWhoseConsumersKeptDying(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	ctx := context.Background()
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), messages("evt", 1))
	if err := c.XGroupCreate(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// Delivered to dead-0, then claimed by dead-1 and dead-2: three
	// deliveries, no answer, the last an hour ago: the consumer claims it
	// on its first pass, and its MinIdle stays far longer than a round
	// trip (with a MinIdle of a millisecond, the consumer found its own
	// claim expired before it could handle the entry, and claimed it again).
	res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead-0", Streams: []string{stream, ">"}, Block: -1}).Result()
	if err != nil {
		t.Fatal(err)
	}
	id := res[0].Messages[0].ID
	for _, name := range []string{"dead-1", "dead-2"} {
		if err := c.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "g", Consumer: name, Messages: []string{id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	backdate(t, c, stream, "g", "dead-2", id)

	var rec recorder
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MinIdle: time.Minute, MaxDeliveries: 3, Handler: rec.handle}))
	dead := stream + outboxredis.DeadStreamSuffix
	testenv.Eventually(t, 10*time.Second, "a dead letter", func() bool { n, _ := c.XLen(ctx, dead).Result(); return n == 1 })
	testenv.Eventually(t, 5*time.Second, "the entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })
	if len(rec.messages()) != 0 {
		t.Errorf("handler called %d times", len(rec.messages()))
	}
	entries, _ := c.XRange(ctx, dead, "-", "+").Result()
	if r := fmt.Sprint(entries[0].Values[outboxredis.FieldDeadReason]); !strings.Contains(r, "delivered 4 times, over MaxDeliveries 3") {
		t.Errorf("dead_reason %q", r)
	}
}

func TestConsumerDeadLettersMalformedEntries(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	ctx := context.Background()
	for _, values := range [][]any{
		{"foo", "bar"}, // no event_id
		{outboxredis.FieldEventID, "evt-bad-time", outboxredis.FieldCreatedAt, "yesterday"},
		{outboxredis.FieldEventID, "evt-good", outboxredis.FieldType, "t", outboxredis.FieldPayload, "{}"},
	} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var rec recorder
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Handler: rec.handle}))
	dead := stream + outboxredis.DeadStreamSuffix
	testenv.Eventually(t, 10*time.Second, "two dead letters", func() bool { n, _ := c.XLen(ctx, dead).Result(); return n == 2 })
	testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })
	if seen := rec.messages(); len(seen) != 1 || seen[0].EventID != "evt-good" {
		t.Fatalf("handler saw %+v, want only evt-good", seen)
	}
	entries, _ := c.XRange(ctx, dead, "-", "+").Result()
	if r := fmt.Sprint(entries[0].Values[outboxredis.FieldDeadReason]); !strings.Contains(r, "no event_id") || entries[0].Values["foo"] != "bar" {
		t.Errorf("first dead letter %v", entries[0].Values)
	}
	if r := fmt.Sprint(entries[1].Values[outboxredis.FieldDeadReason]); !strings.Contains(r, "created_at") {
		t.Errorf("second dead letter reason %q does not name created_at", r)
	}
}

// An entry trimmed from the stream while pending is dropped from the
// group instead of being retried for ever.
func TestConsumerDropsPendingEntriesDeletedFromTheStream(t *testing.T) {
	// Found in its own pending list on restart, and by a claim.
	for _, consumer := range []string{"gone", "other"} {
		t.Run(consumer, func(t *testing.T) {
			c := newClient(t)
			stream := newStream(t, c)
			ctx := context.Background()
			publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), messages("evt", 2))
			if err := c.XGroupCreate(ctx, stream, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			res, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "gone", Streams: []string{stream, ">"}, Block: -1}).Result()
			if err != nil {
				t.Fatal(err)
			}
			backdate(t, c, stream, "g", "gone", res[0].Messages[0].ID, res[0].Messages[1].ID)
			if err := c.XDel(ctx, stream, res[0].Messages[0].ID).Err(); err != nil {
				t.Fatal(err)
			}
			var rec recorder
			runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Consumer: consumer, MinIdle: time.Minute, Handler: rec.handle}))
			testenv.Eventually(t, 10*time.Second, "nothing pending", func() bool { return pendingCount(t, c, stream, "g") == 0 })
			if seen := rec.messages(); len(seen) != 1 || seen[0].EventID != "evt-0001" {
				t.Fatalf("handler saw %+v, want evt-0001 only", seen)
			}
		})
	}
}

func TestConsumerRunReturnsWhenContextEnds(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Block: 100 * time.Millisecond,
		Handler: func(context.Context, outboxredis.Message) error { return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- con.Run(ctx) }()
	testenv.Eventually(t, 5*time.Second, "the group created", func() bool {
		g, _ := c.XInfoGroups(context.Background(), stream).Result()
		return len(g) == 1
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestConsumerRunFailsWhenTheKeyIsNotAStream(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	if err := c.Set(context.Background(), stream, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Handler: func(context.Context, outboxredis.Message) error { return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := con.Run(ctx); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Run = %v, want the WRONGTYPE error", err)
	}
}

// A consumer started before Redis is reachable keeps trying, and returns
// when its context ends.
func TestConsumerWaitsForRedis(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: "s", Group: "g", Handler: func(context.Context, outboxredis.Message) error { return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := con.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil at the end of its context", err)
	}
}

// A batch that takes longer than MinIdle to handle is not claimed by
// another consumer while its consumer works through it: the consumer
// renews its claim on the rest of the batch every MinIdle/2.
func TestConsumerRenewsItsClaimOnASlowBatch(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	const n, minIdle, work = 12, 400 * time.Millisecond, 50 * time.Millisecond // the batch takes 1.5 MinIdle
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), messages("evt", n))

	var mu sync.Mutex
	handledBy := map[string][]string{}
	started := make(chan struct{}, n)
	handler := func(name string) outboxredis.Handler {
		return func(ctx context.Context, m outboxredis.Message) error {
			mu.Lock()
			handledBy[m.EventID] = append(handledBy[m.EventID], name)
			mu.Unlock()
			select {
			case started <- struct{}{}:
			default:
			}
			select { // the handler's work
			case <-time.After(work):
			case <-ctx.Done():
			}
			return nil
		}
	}
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Consumer: "slow", Batch: n, MinIdle: minIdle, Handler: handler("slow")}))
	<-started // slow holds the whole batch
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Consumer: "eager", MinIdle: minIdle, ClaimInterval: 10 * time.Millisecond, Handler: handler("eager")}))
	testenv.Eventually(t, 10*time.Second, "every entry acknowledged", func() bool {
		mu.Lock()
		all := len(handledBy) == n
		mu.Unlock()
		return all && pendingCount(t, c, stream, "g") == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for id, by := range handledBy {
		if len(by) != 1 || by[0] != "slow" {
			t.Errorf("%s handled by %v, want by slow once", id, by)
		}
	}
}

// A group created by a consumer started after the relay begins with the
// entries the relay appended before: Start defaults to "0".
func TestConsumerDefaultStartHandlesEntriesAppendedBefore(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("early", 3)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)
	var rec recorder
	con, err := outboxredis.NewConsumer(c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Block: 50 * time.Millisecond, Handler: rec.handle})
	if err != nil {
		t.Fatal(err)
	}
	runConsumer(t, con)
	testenv.Eventually(t, 10*time.Second, "the events appended before the group was created", func() bool { return rec.distinct() == len(msgs) })
}

// A stream deleted (or evicted) and created again by a relay's XADD has
// lost its groups: the consumer logs an error, creates its group again at
// the start of the stream whatever Start says, and handles every entry
// appended meanwhile.
func TestConsumerCreatesALostGroupAgainAtTheStart(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	ctx := context.Background()
	var rec recorder
	var logs logRecorder
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", Start: "$", Handler: rec.handle, Logger: slog.New(&logs)}))
	testenv.Eventually(t, 5*time.Second, "the group created", func() bool {
		g, _ := c.XInfoGroups(ctx, stream).Result()
		return len(g) == 1
	})
	pub := newPublisher(t, c, outboxredis.Config{Stream: stream})
	publish(t, pub, messages("before", 2))
	testenv.Eventually(t, 10*time.Second, "the first events handled", func() bool { return rec.distinct() == 2 })

	// The key goes, and comes back with new entries, before the consumer
	// reads again.
	after := messages("after", 3)
	if _, err := c.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, stream)
		for _, m := range after {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{outboxredis.FieldEventID, m.EventID, outboxredis.FieldType, m.Type, outboxredis.FieldPayload, m.Body}})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the events appended while the group was gone", func() bool { return rec.distinct() == 2+len(after) })
	testenv.Eventually(t, 5*time.Second, "every entry acknowledged", func() bool { return pendingCount(t, c, stream, "g") == 0 })
	if len(logs.find(slog.LevelError, "consumer group is gone")) == 0 {
		t.Error("the lost group was not logged as an error")
	}
	publish(t, pub, messages("later", 1)) // and it goes on
	testenv.Eventually(t, 10*time.Second, "a later event handled", func() bool { return rec.distinct() == 3+len(after) })
}

// A poison entry that crashes its consumer every time it is handled is
// dead-lettered alone after MaxDeliveries crashes: the entries of its
// batch, handled before it or not reached, are not charged for its crashes.
// Whether the consumer comes back under the same name (its own pending
// list) or another (a claim).
func TestConsumerCrashLoopChargesOnlyTheEntryThatCausesIt(t *testing.T) {
	for _, sameName := range []bool{true, false} {
		t.Run(fmt.Sprintf("sameName=%v", sameName), func(t *testing.T) {
			c := newClient(t)
			stream := newStream(t, c)
			dead := stream + outboxredis.DeadStreamSuffix
			msgs := messages("evt", 6)
			publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)
			poison := msgs[2].EventID
			const maxDeliveries = 3

			var rec recorder
			for run := 0; ; run++ {
				if run > 2*maxDeliveries {
					t.Fatalf("still crashing after %d runs", run)
				}
				// The consumer's own connection: closed when its process
				// "crashes", so that nothing it had not sent reaches Redis.
				client := newClient(t)
				crashed := make(chan struct{})
				cfg := outboxredis.ConsumerConfig{
					Stream: stream, Group: "g", Consumer: "crashy", Batch: 100, MinIdle: time.Hour, MaxDeliveries: maxDeliveries,
					Handler: func(ctx context.Context, m outboxredis.Message) error {
						rec.handle(ctx, m)
						if m.EventID == poison {
							client.Close()
							close(crashed)
							<-ctx.Done()
							return ctx.Err()
						}
						return nil
					},
				}
				if !sameName {
					// A new name claims what the crashed consumers held
					// for MinIdle: an hour ago.
					cfg.Consumer, cfg.MinIdle = fmt.Sprintf("crashy-%d", run), time.Minute
					p, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
					if err != nil && !redis.HasErrorPrefix(err, "NOGROUP") {
						t.Fatal(err)
					}
					for _, e := range p {
						backdate(t, c, stream, "g", e.Consumer, e.ID)
					}
				}
				stop := runConsumer(t, newConsumer(t, client, cfg))
				done := false
				testenv.Eventually(t, 10*time.Second, "a crash, or every entry settled", func() bool {
					select {
					case <-crashed:
						return true
					default:
					}
					n, _ := c.XLen(context.Background(), dead).Result()
					done = n > 0 && pendingCount(t, c, stream, "g") == 0
					return done
				})
				stop()
				if done {
					break
				}
			}

			entries, err := c.XRange(context.Background(), dead, "-", "+").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 || entries[0].Values[outboxredis.FieldEventID] != poison {
				var ids []any
				for _, e := range entries {
					ids = append(ids, e.Values[outboxredis.FieldEventID])
				}
				t.Fatalf("dead letters %v, want only the poison entry %s", ids, poison)
			}
			if n := rec.calls(poison); n != maxDeliveries {
				t.Errorf("the poison entry was handled %d times, want MaxDeliveries (%d)", n, maxDeliveries)
			}
			for _, m := range msgs {
				if n := rec.calls(m.EventID); m.EventID != poison && (n < 1 || n > 2) {
					t.Errorf("%s handled %d times, want once, or twice if its batch crashed before its XACK", m.EventID, n)
				}
			}
		})
	}
}

// An outage of the handler's database makes every call fail: the
// consumer backs off instead of spending every entry's deliveries each
// MinIdle, and handles everything once the database is back. (Time-based:
// the outage lasts 300ms, 30 MinIdle.)
func TestConsumerBacksOffWhileTheHandlerFails(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 4)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)

	var down atomic.Bool
	down.Store(true)
	time.AfterFunc(300*time.Millisecond, func() { down.Store(false) })
	rec := recorder{fail: func(outboxredis.Message, int) error {
		if down.Load() {
			return errors.New("dial tcp 127.0.0.1:5432: connection refused")
		}
		return nil
	}}
	var logs logRecorder
	runConsumer(t, newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MinIdle: 10 * time.Millisecond, MaxDeliveries: 4, Handler: rec.handle, Logger: slog.New(&logs)}))
	// The last pause of the outage may last a few seconds.
	testenv.Eventually(t, 60*time.Second, "every entry acknowledged", func() bool {
		return rec.distinct() == len(msgs) && pendingCount(t, c, stream, "g") == 0
	})
	if n, _ := c.XLen(context.Background(), stream+outboxredis.DeadStreamSuffix).Result(); n != 0 {
		t.Fatalf("%d entries dead-lettered during an outage of the handler's database", n)
	}
	t.Logf("%d handler calls for %d events", len(rec.messages()), len(msgs))
	if len(logs.find(slog.LevelWarn, "pausing reads and claims")) == 0 || len(logs.find(slog.LevelInfo, "resuming")) == 0 {
		t.Error("the pause and the end of the outage were not logged")
	}
}

// A handler error marked Transient (the handler's database is down) is
// retried like any other, but its deliveries do not count: the entry is
// not dead-lettered however often it fails so.
func TestConsumerTransientErrorsDoNotCount(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 2)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)
	const maxDeliveries, outage = 2, 5 // calls
	rec := recorder{fail: func(m outboxredis.Message, calls int) error {
		if m.EventID == msgs[0].EventID && calls <= outage {
			return fmt.Errorf("insert: %w", retry.Transient(errors.New("dial tcp 127.0.0.1:5432: connection refused")))
		}
		return nil
	}}
	// Each retry is brought on by the test, without waiting: once a failed
	// delivery is set back, the entry is made idle for MinIdle (backdate)
	// and the next claim pass takes it. A MinIdle as short as the retry
	// delay would be (10ms) was outlasted by the consumer's own round trips
	// under the race detector, and the entry was claimed again, counted.
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MinIdle: time.Minute, ClaimInterval: 10 * time.Millisecond, MaxDeliveries: maxDeliveries, Handler: rec.handle})
	runConsumer(t, con)
	entries, err := c.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	id := entries[0].ID
	for calls := 1; calls <= outage; calls++ {
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("failed delivery %d set back", calls), func() bool {
			if rec.calls(msgs[0].EventID) != calls {
				return false
			}
			p, err := c.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Result()
			if err != nil {
				t.Fatal(err)
			}
			return len(p) == 1 && p[0].RetryCount == 0
		})
		backdate(t, c, stream, "g", con.Name(), id)
	}
	testenv.Eventually(t, 30*time.Second, "the entry handled after the outage", func() bool {
		if n, _ := c.XLen(context.Background(), stream+outboxredis.DeadStreamSuffix).Result(); n != 0 {
			t.Fatalf("%d entries dead-lettered after transient errors", n)
		}
		return rec.calls(msgs[0].EventID) == outage+1 && pendingCount(t, c, stream, "g") == 0
	})
	for _, m := range rec.messages() {
		if m.Deliveries != 1 {
			t.Errorf("%s: Deliveries %d, want 1: transient failures do not count", m.EventID, m.Deliveries)
		}
	}
}

// A handler error marked retry.Permanent dead-letters its entry on its
// first delivery, however many MaxDeliveries allows; the next entry is
// handled without a pause.
func TestConsumerPermanentErrorDeadLetters(t *testing.T) {
	c := newClient(t)
	stream := newStream(t, c)
	msgs := messages("evt", 2)
	publish(t, newPublisher(t, c, outboxredis.Config{Stream: stream}), msgs)
	rec := recorder{fail: func(m outboxredis.Message, calls int) error {
		if m.EventID == msgs[0].EventID {
			return fmt.Errorf("decode: %w", retry.Permanent(errors.New("not an order")))
		}
		return nil
	}}
	con := newConsumer(t, c, outboxredis.ConsumerConfig{Stream: stream, Group: "g", MaxDeliveries: 10, Handler: rec.handle})
	runConsumer(t, con)
	var dead []redis.XMessage
	testenv.Eventually(t, 30*time.Second, "the first entry dead-lettered, the second handled", func() bool {
		var err error
		dead, err = c.XRange(context.Background(), stream+outboxredis.DeadStreamSuffix, "-", "+").Result()
		return err == nil && len(dead) == 1 && rec.calls(msgs[1].EventID) == 1 && pendingCount(t, c, stream, "g") == 0
	})
	if n := rec.calls(msgs[0].EventID); n != 1 {
		t.Errorf("the permanent failure was handled %d times, want 1", n)
	}
	if reason := fmt.Sprint(dead[0].Values[outboxredis.FieldDeadReason]); !strings.Contains(reason, "not an order") {
		t.Errorf("dead letter reason %q", reason)
	}
}
