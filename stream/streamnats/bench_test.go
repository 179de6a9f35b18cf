package streamnats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

// benchPayload is a typical small event.
var benchPayload = json.RawMessage(`{"order_id":"ord_01HZX3","amount":1999,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)

func benchEvents(prefix string, n int) []stream.Event {
	evs := make([]stream.Event, n)
	for i := range evs {
		evs[i] = stream.Event{
			NativeID: fmt.Sprintf("%s-%d", prefix, i), Type: "order.created", OccurredAt: time.Now(),
			Metadata: json.RawMessage(`{"device_id":"dev-17"}`), Payload: benchPayload,
		}
	}
	return evs
}

// BenchmarkRead reads 200,000 events from offset 1, 1000 per Read, as a
// consumer catching up does, from an in-process server.
func BenchmarkRead(b *testing.B) {
	readBench(b, streamnats.Config{URL: natstest.Start(b)})
}

// BenchmarkReadServer is BenchmarkRead against the NATS of
// POSTBOX_TEST_NATS, under a prefix of its own that it deletes afterwards.
func BenchmarkReadServer(b *testing.B) {
	url := testenv.URL(b, testenv.NATS)
	prefix := runPrefix()
	b.Cleanup(func() { deleteStreams(b, url, prefix) })
	readBench(b, streamnats.Config{URL: url, Prefix: prefix})
}

func readBench(b *testing.B, cfg streamnats.Config) {
	const total, batch = 200_000, 1000
	be := open(b, cfg)
	ctx := context.Background()
	s, err := be.EnsureStream(ctx, "source")
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents("e", total)
	for i := 0; i < total; i += 5000 {
		if _, err := be.Append(ctx, s.ID, evs[i:i+5000]); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := be.EnsureConsumer(ctx, stream.ConsumerConfig{ID: "reader", StreamID: s.ID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		read := 0
		for from := int64(1); ; {
			bt, err := be.Read(ctx, "reader", from, batch)
			if err != nil {
				b.Fatal(err)
			}
			if len(bt.Events) == 0 {
				break
			}
			read += len(bt.Events)
			from = bt.Events[len(bt.Events)-1].Offset + 1
		}
		if read != total {
			b.Fatalf("read %d events, want %d", read, total)
		}
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "events/s")
}

// appendBench runs appenders goroutines, each appending calls of batch
// events through fn until b.N calls were made in all.
func appendBench(b *testing.B, appenders, batch int, fn func(ctx context.Context, evs []stream.Event) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := fn(ctx, benchEvents(fmt.Sprintf("w%d-%d", w, i), batch)); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}

const benchAppenders, benchBatch = 50, 100

// BenchmarkAppend appends calls of 100 events from 50 goroutines, as
// postbox's ingress does with group commits from many connections.
func BenchmarkAppend(b *testing.B) {
	be := open(b, streamnats.Config{URL: natstest.Start(b)})
	s, _ := be.EnsureStream(context.Background(), "source")
	appendBench(b, benchAppenders, benchBatch, func(ctx context.Context, evs []stream.Event) error {
		_, err := be.Append(ctx, s.ID, evs)
		return err
	})
}

// BenchmarkRawPublishAsync is the baseline of BenchmarkAppend: the same
// events, as their payload with a Nats-Msg-Id, published asynchronously
// into a stream with the same settings, acks awaited per call.
func BenchmarkRawPublishAsync(b *testing.B) {
	nc, err := nats.Connect(natstest.Start(b))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(streamnats.DefaultMaxPending))
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"RAW.*"}, Storage: jetstream.FileStorage, Replicas: 1}); err != nil {
		b.Fatal(err)
	}
	appendBench(b, benchAppenders, benchBatch, func(ctx context.Context, evs []stream.Event) error {
		futures := make([]jetstream.PubAckFuture, len(evs))
		for i := range evs {
			m := &nats.Msg{Subject: "RAW.e", Data: evs[i].Payload, Header: nats.Header{jetstream.MsgIDHeader: []string{evs[i].NativeID}}}
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				return err
			}
			futures[i] = f
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			}
		}
		return nil
	})
}
