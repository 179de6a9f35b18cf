package deliverypg_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestLimitsAcrossNodes: three processes deliver one endpoint's items.
// Its concurrency holds over the three (never more in flight at the
// target), and so does its rate (at most the burst and the rate over any
// stretch, not three times them). One process loses its store: it stops
// taking attempts, and its slots go to the others once its lease ends.
func TestLimitsAcrossNodes(t *testing.T) {
	const (
		concurrency = 3
		perSecond   = 60
		events      = 360
	)
	var inflight, most atomic.Int64
	var mu sync.Mutex
	var at []time.Time
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := inflight.Add(1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		inflight.Add(-1)
	}))
	defer tg.Close()
	arrivals := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), at...)
	}
	c := newCluster(t)
	cfg := delivery.Config{Workers: 8, Now: time.Now}
	a, b, d := c.start("a", cfg), c.start("b", cfg), c.start("c", cfg)
	create(t, a, delivery.Subscription{Name: "s", Source: "devices", Target: tg.URL,
		Endpoint: delivery.Endpoint{Concurrency: concurrency, Rate: delivery.Rate{N: perSecond, Per: time.Second}}})
	c.appendEvents("e", events)
	testenv.Eventually(t, 30*time.Second, "deliveries", func() bool { return len(arrivals()) >= events/3 })

	// Between the i-th and j-th request, j-i+1 arrived: at most the burst
	// (one second's worth) and what the rate adds, with 250ms of latency
	// (as TestEndpointRate). Three processes, each counting alone, would
	// send three times as many, and have up to three times the
	// concurrency in flight.
	check := func(when string) []time.Time {
		t.Helper()
		ts := arrivals()
		t.Logf("%s: %d requests in %v, %d at most in flight", when, len(ts), ts[len(ts)-1].Sub(ts[0]), most.Load())
		if got := most.Load(); got > concurrency {
			t.Fatalf("%s: the target saw %d requests at once, want %d at most over the three processes", when, got, concurrency)
		}
		const latency = 250 * time.Millisecond
		for i := range ts {
			for j := i; j < len(ts); j++ {
				if allowed := perSecond + perSecond*(ts[j].Sub(ts[i])+latency).Seconds() + 1; float64(j-i+1) > allowed {
					t.Fatalf("%s: %d requests in %v, want at most %.1f (rate %d/s, burst %d, over three processes)", when, j-i+1,
						ts[j].Sub(ts[i]), allowed, perSecond, perSecond)
				}
			}
		}
		return ts
	}
	check("three processes")

	// The process holding the most slots loses its store.
	holders := map[string]*node{"a": a, "b": b, "c": d}
	var holder string
	if err := c.admin.ReadDB().QueryRow(`SELECT split_part(holder, '/', 1) FROM endpoint_slots GROUP BY 1 ORDER BY count(*) DESC LIMIT 1`).
		Scan(&holder); err != nil {
		t.Fatalf("the slots of the endpoint: %v", err)
	}
	dead := holders[holder]
	dead.store.Close()
	lost := time.Now()
	testenv.Eventually(t, 30*time.Second, "deliveries after the loss", func() bool { return len(arrivals()) >= events*2/3 })
	ts := check(holder + " lost its store")
	// The others took the lost process's slots: concurrency in flight
	// again after the loss.
	var after []time.Time
	for _, x := range ts {
		if x.After(lost) {
			after = append(after, x)
		}
	}
	if len(after) == 0 {
		t.Fatal("no request after the loss")
	}
	if n := c.count(`SELECT count(*) FROM endpoint_slots WHERE holder NOT LIKE $1`, holder+"/%"); n != concurrency {
		t.Fatalf("the live processes hold %d slots after the loss, want all %d", n, concurrency)
	}
}

// TestLimitChangesAcrossNodes: a concurrency lowered on one process holds
// on the others once they read the endpoint again (within a second) and
// the attempts in flight under the old limit end: the slots above it go
// back. With no limit any more, every slot goes back.
func TestLimitChangesAcrossNodes(t *testing.T) {
	var inflight, most atomic.Int64
	var calls atomic.Int64
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := inflight.Add(1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		calls.Add(1)
		time.Sleep(30 * time.Millisecond)
		inflight.Add(-1)
	}))
	defer tg.Close()
	c := newCluster(t)
	cfg := delivery.Config{Workers: 8, Now: time.Now}
	a, b := c.start("a", cfg), c.start("b", cfg)
	create(t, a, delivery.Subscription{Name: "s", Source: "devices", Target: tg.URL, Endpoint: delivery.Endpoint{Concurrency: 4}})
	c.appendEvents("e", 600)
	testenv.Eventually(t, 30*time.Second, "deliveries", func() bool { return calls.Load() >= 50 })
	if got := most.Load(); got != 4 {
		t.Fatalf("%d requests in flight at most, want 4", got)
	}
	if n := c.count(`SELECT count(*) FROM endpoint_slots WHERE inbox_id = 's'`); n == 0 {
		t.Fatal("no slot of inbox s is held while its items are sent")
	}

	ep := delivery.Endpoint{Concurrency: 2}
	if _, err := b.d.Update(context.Background(), "s", delivery.Change{Endpoint: &ep}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the slots above 2 to go back", func() bool {
		return c.count(`SELECT count(*) FROM endpoint_slots WHERE inbox_id = 's' AND slot > 2`) == 0
	})
	time.Sleep(endpointRead) // and every process to have read the new limit
	most.Store(0)
	n := calls.Load()
	testenv.Eventually(t, 30*time.Second, "deliveries under the new limit", func() bool { return calls.Load() >= n+50 })
	if got := most.Load(); got > 2 {
		t.Fatalf("%d requests in flight at most after the limit went to 2, want 2 at most", got)
	}

	ep.Concurrency = 0
	if _, err := a.d.Update(context.Background(), "s", delivery.Change{Endpoint: &ep}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "every slot to go back", func() bool {
		return c.count(`SELECT count(*) FROM endpoint_slots WHERE inbox_id = 's'`) == 0
	})
}

// endpointRead is how long a process may use an endpoint it read before
// another changed it, with a margin.
const endpointRead = 1500 * time.Millisecond
