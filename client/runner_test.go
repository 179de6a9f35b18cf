package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/retry"
)

// apiServer runs a server (SQLite) whose leases expire within 20ms of
// their end, and returns it with an API client of it.
func apiServer(t *testing.T, token string) (*servertest.Server, *client.API) {
	t.Helper()
	s := servertest.Start(t, server.Config{APIToken: token, Delivery: delivery.Config{ReapInterval: 20 * time.Millisecond}}, nil)
	c, err := client.NewAPI(s.Base, client.APIOptions{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// postWebhooks sends n webhooks (keys prefix-0 ...) to the inbox webhooks.
func postWebhooks(t *testing.T, s *servertest.Server, prefix string, n int) {
	t.Helper()
	for i := range n {
		req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(fmt.Sprintf(`{"n": %d}`, i)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", prefix, i))
		resp, err := s.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("webhook %d: %s", i, resp.Status)
		}
	}
}

// counts returns the inbox webhooks' items by state.
func counts(t *testing.T, c *client.API) api.InboxCounts {
	t.Helper()
	all, err := c.Inboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range all {
		if in.Inbox == "webhooks" {
			return in
		}
	}
	return api.InboxCounts{}
}

// run starts r.Run(ctx, h) and returns a function that cancels it and
// waits for Run to return (failing the test if it does not within 30s).
func run(t *testing.T, r *client.Runner, h client.Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx, h) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				err = errors.New("Run did not return 30s after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// quiet is a logger for runners that are expected to log failures.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestAPIErrors: the typed client's calls reach the server, with the
// token, and its errors match the sentinels.
func TestAPIErrors(t *testing.T) {
	s, c := apiServer(t, "s3cret")
	ctx := context.Background()
	if _, err := c.Subscription(ctx, "nope"); !client.IsNotFound(err) {
		t.Fatalf("unknown subscription: %v, want ErrNotFound", err)
	}
	sub, created, err := c.CreateSubscription(ctx, api.CreateSubscription{Name: "jobs", Source: "webhooks", Start: "earliest"})
	if err != nil || !created || sub.Inbox != "jobs" {
		t.Fatalf("create: %+v %v %v", sub, created, err)
	}
	if _, created, err := c.CreateSubscription(ctx, api.CreateSubscription{Name: "jobs", Source: "webhooks", Start: "earliest"}); err != nil || created {
		t.Fatalf("create again: %v %v", created, err)
	}
	_, _, err = c.CreateSubscription(ctx, api.CreateSubscription{Name: "jobs", Source: "devices"})
	var ae *client.APIError
	if !client.IsConflict(err) || !errors.As(err, &ae) || ae.Code != api.CodeConflict {
		t.Fatalf("create with another definition: %v, want a conflict", err)
	}
	if _, _, err := c.CreateSubscription(ctx, api.CreateSubscription{Name: "bad name", Source: "webhooks"}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a bad name: %v, want ErrInvalid", err)
	}
	target := "http://127.0.0.1:9/hook"
	up, err := c.UpdateSubscription(ctx, "jobs", api.UpdateSubscription{Target: &target, EndpointSettings: api.EndpointSettings{Timeout: ptr("5s")}})
	if err != nil || up.Target == nil || *up.Target != target || up.Timeout == nil || *up.Timeout != "5s" {
		t.Fatalf("set target: %+v %v", up, err)
	}
	none := ""
	up, err = c.UpdateSubscription(ctx, "jobs", api.UpdateSubscription{Target: &none, Reset: []string{"timeout"}})
	if err != nil || up.Target != nil || up.Timeout != nil {
		t.Fatalf("remove the target and reset the timeout: %+v %v", up, err)
	}

	postWebhooks(t, s, "e", 3)
	l, err := c.Lease(ctx, "webhooks", client.LeaseOptions{Max: 2, VisibilityTimeout: time.Minute, Wait: 5 * time.Second})
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("lease: %d items, %v", len(l.Items), err)
	}
	ext, err := c.Extend(ctx, "webhooks", l.Lease, 2*time.Minute, l.Items[0].ID)
	if err != nil || client.ResultErr(ext.Items[0]) != nil || !ext.ExpiresAt.After(l.ExpiresAt) {
		t.Fatalf("extend: %+v %v (lease ended %v)", ext, err, l.ExpiresAt)
	}
	res, err := c.Ack(ctx, "webhooks", l.Lease, l.Items[0].ID)
	if err != nil || res[0].State != api.StateCompleted {
		t.Fatalf("ack: %+v %v", res, err)
	}
	ext, err = c.Extend(ctx, "webhooks", l.Lease, time.Minute, l.Items[0].ID)
	if err != nil || !errors.Is(client.ResultErr(ext.Items[0]), client.ErrLeaseLost) {
		t.Fatalf("extend after the ack: %+v %v, want lease_lost", ext, err)
	}
	res, err = c.Nack(ctx, "webhooks", l.Lease, client.NackOptions{Delay: time.Hour, Reason: "later"}, l.Items[1].ID)
	if err != nil || res[0].State != api.StatePending {
		t.Fatalf("nack: %+v %v", res, err)
	}
	it, err := c.Item(ctx, "webhooks", l.Items[1].ID)
	if err != nil || it.LastError == nil || *it.LastError != "later" || !it.NextAttemptAt.After(time.Now().Add(50*time.Minute)) {
		t.Fatalf("the nacked item: %+v %v", it, err)
	}
	page, err := c.Items(ctx, "webhooks", client.ItemsQuery{State: api.StatePending})
	if err != nil || len(page.Items) != 2 {
		t.Fatalf("pending items: %+v %v", page, err)
	}
	if dl, err := c.DeadLetters(ctx, client.DeadLetterQuery{Inbox: "webhooks"}); err != nil || len(dl.Items) != 0 {
		t.Fatalf("dead letters: %+v %v", dl, err)
	}
	if _, err := c.ReplayDeadLetter(ctx, l.Items[1].ID); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("replay of an item that is not a dead letter: %v, want ErrInvalidState", err)
	}
	// e-0 is completed in webhooks and waits in jobs, which nothing
	// leases: the lookup says so per subscription, and its status is the
	// one that waits.
	wh, err := c.WebhookByKey(ctx, "e-0")
	if err != nil || wh.IdempotencyKey != "e-0" || wh.Status != api.StatePending || wh.Subscription != "jobs" || len(wh.Deliveries) != 2 {
		t.Fatalf("webhook e-0: %+v %v", wh, err)
	}
	if d := wh.Deliveries[1]; d.Subscription != "webhooks" || d.Item == nil || d.Item.State != api.StateCompleted {
		t.Fatalf("webhook e-0 in webhooks: %+v", d)
	}
	// A webhook of a source of its own is found by its id and its key.
	if _, _, err := c.CreateSource(ctx, api.CreateSource{Name: "shop", Kind: "webhook"}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks/shop", strings.NewReader(`{"order": 1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "e-0")
	resp, err := s.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a webhook to the source shop: %s", resp.Status)
	}
	wh, err = c.SourceWebhookByKey(ctx, "shop", "e-0")
	if err != nil || wh.ID != "wh_shop_1" {
		t.Fatalf("the shop's webhook e-0: %+v %v, want wh_shop_1", wh, err)
	}
	if byID, err := c.Webhook(ctx, wh.ID); err != nil || byID.IdempotencyKey != "e-0" || byID.ID != wh.ID {
		t.Fatalf("webhook %s: %+v %v", wh.ID, byID, err)
	}

	if cons, err := c.Consumer(ctx, "jobs"); err != nil || cons.Subscription != "jobs" {
		t.Fatalf("consumer jobs: %+v %v", cons, err)
	}
	latest := true
	if res, err := c.ResetConsumer(ctx, "jobs", api.ResetRequest{Latest: &latest}); err != nil || res.Start.Policy != "latest" {
		t.Fatalf("reset consumer jobs to latest: %+v %v", res, err)
	}
	if _, err := c.ResetConsumer(ctx, "jobs", api.ResetRequest{}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("a reset to nowhere: %v, want ErrInvalid", err)
	}
	if h, err := c.ConsumerCommits(ctx, "jobs", 10); err != nil || len(h.Commits) == 0 || h.Commits[0].Kind != api.MoveReset {
		t.Fatalf("history of consumer jobs: %+v %v, want the reset first", h, err)
	}

	wrong, err := client.NewAPI(s.Base, client.APIOptions{Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Streams(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("a wrong token: %v, want ErrUnauthorized", err)
	}
	if err := wrong.Inbox("webhooks", client.RunnerConfig{Logger: quiet()}).Run(ctx, func(context.Context, api.Item) error { return nil }); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("a runner with a wrong token: %v, want ErrUnauthorized", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestRunnerPanics: every item is completed once; a handler that panics
// fails its attempt (the panic is the item's last error) and the item is
// handled again; one whose error is retry.Permanent is a dead letter at
// once.
func TestRunnerPanics(t *testing.T) {
	s, c := apiServer(t, "")
	postWebhooks(t, s, "p", 20)
	var mu sync.Mutex
	done := map[string]int{}
	var panicked atomic.Int64
	r := c.Inbox("webhooks", client.RunnerConfig{Concurrency: 4, Wait: time.Second,
		Backoff: retry.Backoff{Base: time.Millisecond, Max: time.Millisecond}, Logger: quiet()})
	stop := run(t, r, func(ctx context.Context, it api.Item) error {
		if it.EventID == "p-3" {
			return retry.Permanent(errors.New("malformed p-3"))
		}
		if it.EventID == "p-7" && it.Attempts == 1 {
			panicked.Store(it.ID)
			panic("boom on p-7")
		}
		mu.Lock()
		done[it.EventID]++
		mu.Unlock()
		return nil
	})
	testenv.Eventually(t, 30*time.Second, "every item completed or dead", func() bool {
		n := counts(t, c)
		return n.Completed == 19 && n.Failed == 1
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	dead, err := c.DeadLetters(context.Background(), client.DeadLetterQuery{Inbox: "webhooks"})
	if err != nil || len(dead.Items) != 1 || dead.Items[0].EventID != "p-3" || dead.Items[0].Attempts != 1 {
		t.Fatalf("dead letters: %+v %v, want p-3 after its first attempt (retry.Permanent)", dead.Items, err)
	}
	for i := range 20 {
		if i == 3 {
			continue
		}
		if n := done[fmt.Sprint("p-", i)]; n != 1 {
			t.Errorf("p-%d handled to completion %d times, want 1", i, n)
		}
	}
	it, err := c.Item(context.Background(), "webhooks", panicked.Load())
	if err != nil || it.Attempts != 2 || it.LastError == nil || !strings.Contains(*it.LastError, "panic: boom on p-7") {
		t.Fatalf("the item whose handler panicked: %+v %v, want 2 attempts, last error the panic", it, err)
	}
}

// TestRunnerSlowJob: a handler that runs past the visibility timeout keeps
// its item (the runner extends the lease); another runner on the inbox
// never gets it, and it is handled once.
func TestRunnerSlowJob(t *testing.T) {
	s, c := apiServer(t, "")
	postWebhooks(t, s, "s", 1)
	ctx := context.Background()
	var handled atomic.Int64
	started := make(chan api.Item, 1)
	release := make(chan struct{})
	cfg := client.RunnerConfig{Concurrency: 2, VisibilityTimeout: 2 * time.Second, Heartbeat: 200 * time.Millisecond, Wait: 100 * time.Millisecond}
	slow := run(t, c.Inbox("webhooks", cfg), func(ctx context.Context, it api.Item) error {
		handled.Add(1)
		started <- it
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	it := <-started
	other := run(t, c.Inbox("webhooks", cfg), func(ctx context.Context, it api.Item) error {
		handled.Add(1)
		return nil
	})
	// Wait until the lease has been extended to well past several
	// visibility timeouts of the first lease.
	first := *it.LeaseExpiresAt
	testenv.Eventually(t, 30*time.Second, "the lease extended past 2 visibility timeouts", func() bool {
		got, err := c.Item(ctx, "webhooks", it.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != api.StateProcessing || got.Attempts != 1 {
			t.Fatalf("the slow job's item: %s after %d attempts, want processing on its first", got.State, got.Attempts)
		}
		return got.LeaseExpiresAt != nil && got.LeaseExpiresAt.Sub(first) > 2*cfg.VisibilityTimeout
	})
	close(release)
	testenv.Eventually(t, 30*time.Second, "the slow item completed", func() bool { return counts(t, c).Completed == 1 })
	if err := errors.Join(slow(), other()); err != nil {
		t.Fatal(err)
	}
	if n := handled.Load(); n != 1 {
		t.Fatalf("handled %d times, want 1", n)
	}
	got, _ := c.Item(ctx, "webhooks", it.ID)
	if got.Attempts != 1 {
		t.Fatalf("%d attempts, want 1", got.Attempts)
	}
}

// TestRunnerShutdown: when Run's context ends mid-job, the running
// handler finishes and its item is acked; a handler that outlives the
// shutdown timeout is told to stop and its item is nacked without delay,
// so that it is pending again at once.
func TestRunnerShutdown(t *testing.T) {
	s, c := apiServer(t, "")
	ctx := context.Background()

	t.Run("finishes", func(t *testing.T) {
		postWebhooks(t, s, "f", 1)
		started, release := make(chan struct{}), make(chan struct{})
		var stopped atomic.Bool
		stop := run(t, c.Inbox("webhooks", client.RunnerConfig{Wait: 100 * time.Millisecond}), func(ctx context.Context, it api.Item) error {
			close(started)
			<-release
			if ctx.Err() != nil {
				stopped.Store(true)
			}
			return nil
		})
		<-started
		errc := make(chan error, 1)
		go func() { errc <- stop() }()
		// Run waits for the job: it has not returned while the job runs.
		select {
		case err := <-errc:
			t.Fatalf("Run returned (%v) while a job ran", err)
		default:
		}
		close(release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if stopped.Load() {
			t.Fatal("the job's context ended before the shutdown timeout")
		}
		if n := counts(t, c); n.Completed != 1 || n.Processing != 0 {
			t.Fatalf("after Run returned: %+v, want the item completed", n)
		}
	})

	t.Run("cut off", func(t *testing.T) {
		postWebhooks(t, s, "g", 1)
		started := make(chan int64, 1)
		stop := run(t, c.Inbox("webhooks", client.RunnerConfig{Wait: 100 * time.Millisecond, ShutdownTimeout: 50 * time.Millisecond, Logger: quiet()}),
			func(ctx context.Context, it api.Item) error {
				started <- it.ID
				<-ctx.Done()
				return fmt.Errorf("stopped: %w", ctx.Err())
			})
		id := <-started
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		it, err := c.Item(ctx, "webhooks", id)
		if err != nil || it.State != api.StatePending || it.LastError == nil || !strings.Contains(*it.LastError, "stopped: context canceled") ||
			it.NextAttemptAt.After(time.Now()) {
			t.Fatalf("the item cut off: %+v %v, want pending, due now, its error the handler's", it, err)
		}
	})
}
