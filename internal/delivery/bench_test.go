package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// BenchmarkMaterialise measures one subscription turning a backlog of
// b.N events into inbox items while four producers keep appending to the
// same stream (the writer is shared). It reports the subscription's rate
// and the producers' rate over the same time.
func BenchmarkMaterialise(b *testing.B) {
	e := setupB(b)
	backlog := max(b.N, 10000)
	payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
	meta := json.RawMessage(`{"device_id":"pi-1","session_id":"s-1"}`)
	appendBatch := func(prefix string, from, n int) error {
		evs := make([]stream.Event, n)
		for i := range evs {
			evs[i] = stream.Event{NativeID: fmt.Sprintf("%s-%d", prefix, from+i), Type: "proposal.task", OccurredAt: time.Now(), Metadata: meta, Payload: payload}
		}
		_, err := e.store.Append(context.Background(), "devices", evs)
		return err
	}
	for i := 0; i < backlog; i += 1000 {
		if err := appendBatch("backlog", i, min(1000, backlog-i)); err != nil {
			b.Fatal(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var ingested atomic.Int64
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i += 100 {
				if err := appendBatch(fmt.Sprint("live", p), i, 100); err != nil {
					return
				}
				ingested.Add(100)
			}
		})
	}
	b.ResetTimer()
	startIngested := ingested.Load()
	if _, _, err := e.d.Create(context.Background(), delivery.Subscription{Name: "bench", Source: "devices", Types: []string{"proposal.*"},
		Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		b.Fatal(err)
	}
	for {
		c, err := e.store.Consumer(context.Background(), "bench")
		if err == nil && c.NextOffset > int64(backlog) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := b.Elapsed().Seconds()
	live := ingested.Load() - startIngested
	b.StopTimer()
	stop()
	wg.Wait()
	b.ReportMetric(float64(backlog)/elapsed, "events/s")
	b.ReportMetric(float64(live)/elapsed, "ingest-events/s")
	b.ReportMetric(0, "ns/op")
}
