package outboxredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
)

// pauseLog keeps the "failures" attribute of the records whose message is
// one of Run's handler pause or resume messages.
type pauseLog struct {
	mu      sync.Mutex
	pauses  []int64 // failures in a row at each pause
	resumes []int64 // failures in a row before each success
}

func (h *pauseLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *pauseLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *pauseLog) WithGroup(string) slog.Handler            { return h }

func (h *pauseLog) Handle(_ context.Context, r slog.Record) error {
	var failures int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "failures" {
			failures = a.Value.Int64()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	switch r.Message {
	case "outboxredis: handler failed; pausing reads and claims":
		h.pauses = append(h.pauses, failures)
	case "outboxredis: handler succeeded again; resuming":
		h.resumes = append(h.resumes, failures)
	}
	return nil
}

func (h *pauseLog) last() (pause int64, resumes []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pauses) > 0 {
		pause = h.pauses[len(h.pauses)-1]
	}
	return pause, append([]int64(nil), h.resumes...)
}

// After each failing handler call Run pauses before it reads or claims
// again, for a backoff that grows with the failures in a row, and the
// first success resets the count. The test holds each pause (Consumer.wait)
// and counts the handler calls between pauses.
func TestRunPausesAfterHandlerFailures(t *testing.T) {
	opt, err := redis.ParseURL(testenv.URL(t, testenv.Redis))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	b := make([]byte, 6)
	rand.Read(b)
	stream := "postbox-test:" + t.Name() + ":" + hex.EncodeToString(b)
	t.Cleanup(func() {
		c.Del(context.Background(), stream, stream+DeadStreamSuffix)
		c.Close()
	})
	ctx := context.Background()
	add := func(id string) {
		t.Helper()
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{FieldEventID, id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
		add(id)
	}

	var down atomic.Bool
	down.Store(true)
	var calls atomic.Int64
	var logs pauseLog
	con, err := NewConsumer(c, ConsumerConfig{
		Stream: stream, Group: "g", Block: 10 * time.Millisecond, MinIdle: 10 * time.Millisecond, Logger: slog.New(&logs),
		Handler: func(context.Context, Message) error {
			calls.Add(1)
			if down.Load() {
				return errors.New("the database is down")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	pauses := make(chan time.Duration)
	release := make(chan struct{})
	con.wait = func(ctx context.Context, d time.Duration) {
		select {
		case pauses <- d:
		case <-ctx.Done():
			return
		}
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- con.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	// pause waits for Run to pause, and checks that it paused after
	// failures handler errors in a row and wantCalls handler calls in all.
	pause := func(failures, wantCalls int64) {
		t.Helper()
		var d time.Duration
		select {
		case d = <-pauses:
		case <-time.After(10 * time.Second):
			t.Fatalf("Run did not pause after %d handler errors in a row", failures)
		}
		if got, _ := logs.last(); got != failures {
			t.Fatalf("Run paused after %d handler errors in a row, want %d", got, failures)
		}
		if ceil := pace.Ceiling(int(failures - 1)); d >= ceil {
			t.Fatalf("pause %s after %d errors in a row, want under %s", d, failures, ceil)
		}
		if n := calls.Load(); n != wantCalls {
			t.Fatalf("paused after %d handler calls, want %d", n, wantCalls)
		}
	}
	resume := func() { release <- struct{}{} }

	pause(3, 3) // the first read: three entries failed
	resume()
	pause(4, 4) // then the claims, one entry at a time
	resume()
	pause(5, 5)
	resume()
	pause(6, 6)
	down.Store(false) // the next claim succeeds, and the rest follow without a pause
	resume()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := c.XPending(ctx, stream, "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		if p.Count == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d entries still pending 10s after the database came back", p.Count)
		}
		select {
		case d := <-pauses:
			t.Fatalf("Run paused for %s after the handler succeeded", d)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, resumes := logs.last(); len(resumes) != 1 || resumes[0] != 6 {
		t.Fatalf("resumes logged after %v errors in a row, want once, after 6", resumes)
	}

	// The count starts again from one.
	down.Store(true)
	n := calls.Load()
	add("evt-4")
	pause(1, n+1)
}

// A handler's retry.RetryAfter makes Run pause at least that long (at
// most pace.Max) before it reads or claims again, however short the
// backoff of the failures in a row.
func TestRunPausesForRetryAfter(t *testing.T) {
	opt, err := redis.ParseURL(testenv.URL(t, testenv.Redis))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	b := make([]byte, 6)
	rand.Read(b)
	stream := "postbox-test:" + t.Name() + ":" + hex.EncodeToString(b)
	t.Cleanup(func() {
		c.Del(context.Background(), stream, stream+DeadStreamSuffix)
		c.Close()
	})
	ctx := context.Background()
	for _, id := range []string{"evt-1", "evt-2"} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{FieldEventID, id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	asks := map[string]time.Duration{"evt-1": 20 * time.Second, "evt-2": time.Hour}
	con, err := NewConsumer(c, ConsumerConfig{
		Stream: stream, Group: "g", Block: 10 * time.Millisecond, MinIdle: time.Hour,
		Handler: func(_ context.Context, m Message) error {
			return retry.RetryAfter(asks[m.EventID], errors.New("rate limited"))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	pauses := make(chan time.Duration, 1)
	con.wait = func(ctx context.Context, d time.Duration) {
		select {
		case pauses <- d:
		default:
		}
		<-ctx.Done()
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- con.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	select {
	case d := <-pauses:
		if d != pace.Max { // the longer ask of the batch, bounded
			t.Fatalf("paused %s after a RetryAfter of an hour, want %s", d, pace.Max)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not pause after the handler's RetryAfter")
	}
}
