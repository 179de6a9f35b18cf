package client_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// BenchmarkRunner measures the runner over HTTP: b.N webhooks wait in the
// inbox of a server on loopback (SQLite, its defaults), and a runner with
// a do-nothing handler leases, handles and acks them all. Only the
// runner's work is timed; items/s is the figure BENCHMARKS.md records.
//
//	go test -run '^$' -bench BenchmarkRunner -benchtime 20000x ./client/
func BenchmarkRunner(b *testing.B) {
	for _, conc := range []int{64, 256} {
		b.Run(fmt.Sprint("concurrency=", conc), func(b *testing.B) {
			s := servertest.Start(b, server.Config{}, nil)
			c, err := client.NewAPI(s.Base, client.APIOptions{})
			if err != nil {
				b.Fatal(err)
			}
			preload(b, s, b.N)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			handled := 0
			all := make(chan struct{})
			r := c.Inbox("webhooks", client.RunnerConfig{Concurrency: conc, Wait: time.Second})
			b.ResetTimer()
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				done <- r.Run(ctx, func(context.Context, api.Item) error {
					mu.Lock()
					handled++
					if handled == b.N {
						close(all)
					}
					mu.Unlock()
					return nil
				})
			}()
			<-all
			// Handled is not yet acked: wait for the acks too.
			for {
				in, err := c.Inboxes(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if len(in) > 0 && completed(in) == int64(b.N) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "items/s")
		})
	}
}

func completed(in []api.InboxCounts) int64 {
	for _, c := range in {
		if c.Inbox == "webhooks" {
			return c.Completed
		}
	}
	return 0
}

// preload sends n webhooks to s, 16 at a time.
func preload(b *testing.B, s *servertest.Server, n int) {
	b.Helper()
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				req, _ := http.NewRequest(http.MethodPost, s.Base+"/webhooks", strings.NewReader(`{"n": 1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", fmt.Sprint("b-", i))
				resp, err := s.HTTP.Do(req)
				if err != nil {
					errc <- err
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					errc <- fmt.Errorf("webhook %d: %s", i, resp.Status)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}
