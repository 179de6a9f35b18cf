package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
	e := setup(b, sqliteStore, delivery.Config{})
	backlog := max(b.N, 10000)
	payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
	meta := json.RawMessage(`{"device_id":"pi-1","session_id":"s-1"}`)
	appendBatch := func(prefix string, from, n int) error {
		evs := make([]stream.Event, n)
		for i := range evs {
			evs[i] = stream.Event{NativeID: fmt.Sprintf("%s-%d", prefix, from+i), Type: "proposal.task", OccurredAt: time.Now(), Metadata: meta, Payload: payload}
		}
		_, err := e.streams.Append(context.Background(), "devices", evs)
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
		c, err := e.streams.Consumer(context.Background(), "bench")
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

// BenchmarkWorkersHTTP measures the workers pushing a backlog of b.N
// items to a local HTTP target that answers 204 at once: lease, POST,
// ack, with the default 16 workers; unsigned, and signed with a secret
// (Standard Webhooks headers on every request).
func BenchmarkWorkersHTTP(b *testing.B) {
	b.Run("unsigned", func(b *testing.B) { benchmarkWorkersHTTP(b, "") })
	b.Run("signed", func(b *testing.B) { benchmarkWorkersHTTP(b, secretA) })
}

func benchmarkWorkersHTTP(b *testing.B, secret string) {
	var got atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	e := setup(b, sqliteStore, delivery.Config{Now: time.Now})
	n := max(b.N, 1000)
	e.create(b, delivery.Subscription{Name: "bench", Source: "devices"})
	payload := json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"summarize last night crash logs and tell me what went wrong with the deploy, please, thanks","n":0000000}`)
	for i := 0; i < n; i += 1000 {
		evs := make([]stream.Event, min(1000, n-i))
		for j := range evs {
			evs[j] = stream.Event{NativeID: fmt.Sprint("w-", i+j), Type: "t", OccurredAt: time.Now(), Payload: payload}
		}
		if _, err := e.streams.Append(context.Background(), "devices", evs); err != nil {
			b.Fatal(err)
		}
	}
	e.waitLag(b, "bench", 0)
	b.ResetTimer()
	change := delivery.Change{Target: &target.URL}
	if secret != "" {
		change.Secret = &secret
	}
	if _, err := e.d.Update(context.Background(), "bench", change); err != nil {
		b.Fatal(err)
	}
	for got.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	for { // and the last acks are in
		counts, err := e.d.Inboxes(context.Background())
		if err == nil && len(counts) == 1 && counts[0].Completed == int64(n) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := b.Elapsed().Seconds()
	b.StopTimer()
	if got.Load() != int64(n) {
		b.Fatalf("the target got %d requests for %d items", got.Load(), n)
	}
	b.ReportMetric(float64(n)/elapsed, "items/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLeaseAck measures a runtime's lease of up to 64 items and
// their ack, per item, on SQLite, from a backlog of 1,000 keys × 30
// events, unordered and ordered per key (order_by /k): what ordering adds
// to a lease and an ack.
func BenchmarkLeaseAck(b *testing.B) {
	for _, by := range []string{"", "/k"} {
		b.Run("order_by="+by, func(b *testing.B) {
			e := setup(b, sqliteStore, delivery.Config{})
			e.create(b, delivery.Subscription{Name: "orders", Source: "devices", Start: stream.Start{Policy: stream.StartEarliest}, OrderBy: by})
			e.appendKeyed(b, keyNames(1000), max(30, b.N/1000+1))
			e.waitLag(b, "orders", 0)
			ctx := context.Background()
			b.ResetTimer()
			for n := 0; n < b.N; {
				l, err := e.d.Lease(ctx, "orders", 64, time.Minute, 0)
				if err != nil || len(l.Items) == 0 {
					b.Fatalf("lease: %d items, %v", len(l.Items), err)
				}
				ids := make([]int64, len(l.Items))
				for i, it := range l.Items {
					ids[i] = it.ID
				}
				if _, err := e.d.Ack(ctx, "orders", ids, l.Token); err != nil {
					b.Fatal(err)
				}
				n += len(ids)
			}
		})
	}
}
