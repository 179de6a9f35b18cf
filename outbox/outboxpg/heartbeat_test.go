package outboxpg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
)

// slowStore is a relay's store whose Settle waits for release: a
// database too loaded to record outcomes within the claim period.
type slowStore struct {
	*outboxpg.Store
	release <-chan struct{}
}

func (s slowStore) Settle(ctx context.Context, outcomes []outbox.Outcome) error {
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Settle(ctx, outcomes)
}

// watchedStore is a relay's store that records when it called Due.
type watchedStore struct {
	*outboxpg.Store
	mu    *sync.Mutex
	calls *[]time.Time
}

func (s watchedStore) Due(ctx context.Context, now time.Time, after int64, limit int) ([]outbox.Message, error) {
	s.mu.Lock()
	*s.calls = append(*s.calls, time.Now())
	s.mu.Unlock()
	return s.Store.Due(ctx, now, after, limit)
}

// A relay that is alive keeps its claims past the claim period while its
// work takes longer (a publish that does not return, or a store too slow
// to record the outcomes): a second relay polling the outbox all along
// sends none of its rows, and every row is sent once.
func TestLiveRelayKeepsItsClaimsPastTheClaimPeriod(t *testing.T) {
	const claim = 2 * time.Second
	for _, slow := range []string{"publish", "settle"} {
		t.Run(slow, func(t *testing.T) {
			pool, _ := setup(t)
			const rows = 20
			var evs []outbox.Event
			for i := range rows {
				evs = append(evs, event(fmt.Sprintf("%s-%d", slow, i)))
			}
			insertEvents(t, pool, evs...)

			var mu sync.Mutex
			sends := map[string]int{}
			release := make(chan struct{})
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
			leases := make(chan time.Time, 1)
			publisher := func(first bool) pubFunc {
				return func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
					mu.Lock()
					for _, m := range msgs {
						sends[m.EventID]++
					}
					mu.Unlock()
					if first {
						select {
						case leases <- msgs[0].Lease:
						default:
						}
						if slow == "publish" {
							select {
							case <-release:
							case <-ctx.Done():
								return nil, ctx.Err()
							}
						}
					}
					out := make([]postbox.Reply, len(msgs))
					for i, m := range msgs {
						out[i] = postbox.Ack(m.EventID, time.Now(), false)
					}
					return out, nil
				}
			}
			var first outbox.Store = newStore(t, pool, outboxpg.Config{Claim: claim})
			if slow == "settle" {
				first = slowStore{first.(*outboxpg.Store), release}
			}
			cfg := outbox.RelayConfig{BatchSize: 100, MaxInFlight: 100, PollInterval: 20 * time.Millisecond, SettleTimeout: time.Minute}
			runRelay(t, first, publisher(true), cfg)
			var lease time.Time
			select {
			case lease = <-leases:
			case <-time.After(15 * time.Second):
				t.Fatal("the first relay published nothing")
			}
			mu.Lock()
			if len(sends) != rows {
				t.Fatalf("the first relay's publish carried %d of the %d rows", len(sends), rows)
			}
			mu.Unlock()

			// The second relay polls every 20ms from now on; wait until it
			// has looked for due rows several times after the first
			// relay's claims would have run out twice over.
			var calls []time.Time
			runRelay(t, watchedStore{newStore(t, pool, outboxpg.Config{Claim: claim}), &mu, &calls}, publisher(false), cfg)
			expired := lease.Add(2 * claim)
			eventually(t, "the second relay to poll after the first relay's claims would have ended", func() bool {
				mu.Lock()
				defer mu.Unlock()
				n := 0
				for _, c := range calls {
					if c.After(expired) {
						n++
					}
				}
				return n >= 5
			})
			mu.Lock()
			for id, n := range sends {
				if n != 1 {
					t.Errorf("%s sent %d times while the relay holding it was alive and %s was slow", id, n, slow)
				}
			}
			mu.Unlock()

			releaseOnce.Do(func() { close(release) })
			eventually(t, "every row delivered", func() bool {
				return count(t, pool, `SELECT count(*) FROM outbox WHERE delivered_at IS NOT NULL`) == rows
			})
			mu.Lock()
			defer mu.Unlock()
			if len(sends) != rows {
				t.Fatalf("%d rows sent, want %d", len(sends), rows)
			}
			for id, n := range sends {
				if n != 1 {
					t.Fatalf("%s sent %d times", id, n)
				}
			}
		})
	}
}
