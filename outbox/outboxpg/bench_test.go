package outboxpg_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxpg"
)

// benchRelay measures a relay of b.N rows, inserted first (not timed).
func benchRelay(b *testing.B, pub outbox.Publisher, cfg outbox.RelayConfig) {
	ctx := context.Background()
	pool, _ := setup(b)
	for i := 0; i < b.N; i += 1000 {
		var es []outbox.Event
		for j := i; j < min(b.N, i+1000); j++ {
			es = append(es, outbox.Event{Type: "order.created", Payload: []byte(`{"order":"` + fmt.Sprint(j) + `","total":42,"currency":"EUR","lines":[{"sku":"A-1","qty":2}]}`)})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outboxpg.InsertPgx(ctx, tx, es...) }); err != nil {
			b.Fatal(err)
		}
	}
	s, err := outboxpg.New(pool, outboxpg.Config{})
	if err != nil {
		b.Fatal(err)
	}
	var delivered atomic.Int64
	done := make(chan struct{})
	cfg.Observe = func(st outbox.Stats) {
		if delivered.Add(int64(st.Delivered)) == int64(b.N) {
			close(done)
		}
	}
	r, err := outbox.NewRelay(s, pub, cfg)
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	b.ResetTimer()
	start := time.Now()
	go r.Run(rctx)
	<-done
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.StopTimer()
	cancel()
}

func BenchmarkRelayNoopPublisher(b *testing.B) {
	pub := pubFunc(func(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
		out := make([]postbox.Reply, len(msgs))
		for i, m := range msgs {
			out[i] = postbox.Reply{EventID: m.EventID, Status: postbox.StatusStored}
		}
		return out, nil
	})
	benchRelay(b, pub, outbox.RelayConfig{BatchSize: 1000, MaxInFlight: 8000})
}
