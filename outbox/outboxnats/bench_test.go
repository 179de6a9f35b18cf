package outboxnats_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxnats"
)

// BenchmarkPublish publishes batches of 256 events of ~200 bytes into a
// file-backed stream, one batch at a time and with 16 batches in flight
// (the relay's default: MaxInFlight 4096 / BatchSize 256). It reports
// events/s; an op is one batch.
func BenchmarkPublish(b *testing.B) {
	const batch = 256
	body := `{"order_id":"ord_0001","customer":"cus_42","amount_cents":12345,"currency":"EUR","items":[{"sku":"sku-1","qty":2},{"sku":"sku-2","qty":1}],"note":"` + strings.Repeat("x", 40) + `"}`
	for _, inFlight := range []int{1, 16} {
		b.Run(fmt.Sprintf("batch=%d/inflight=%d", batch, inFlight), func(b *testing.B) {
			url, name, _ := newStream(b, nil)
			_, js := connect(b, url)
			p := newPublisher(b, js, outboxnats.Config{Stream: name})
			var seq atomic.Int64
			next := func() []outbox.Message {
				msgs := make([]outbox.Message, batch)
				for i := range msgs {
					msgs[i] = outbox.Message{EventID: fmt.Sprintf("evt_%012d", seq.Add(1)), Type: "order.created", Body: []byte(body), CorrelationID: "corr", TenantID: "t1"}
				}
				return msgs
			}
			work := make(chan []outbox.Message)
			b.ResetTimer()
			var wg sync.WaitGroup
			for range inFlight {
				wg.Go(func() {
					for msgs := range work {
						replies, err := p.Publish(context.Background(), msgs)
						if err != nil {
							b.Error(err)
							return
						}
						for _, r := range replies {
							if !r.OK() || r.Duplicate {
								b.Errorf("reply %+v", r)
								return
							}
						}
					}
				})
			}
			for b.Loop() {
				work <- next()
			}
			close(work)
			wg.Wait()
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
