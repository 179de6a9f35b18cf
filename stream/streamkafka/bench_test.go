package streamkafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox/internal/kafkatest"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

// benchPayload is a typical small event.
var benchPayload = json.RawMessage(`{"order_id":"ord_01HZX3","amount":1999,"currency":"EUR","items":[{"sku":"A-1","qty":2}]}`)

// benchBatch is how many events one Append (or one round of raw
// produces) carries: a group commit of postbox's ingest.
const benchBatch = 256

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

// BenchmarkAppend appends b.N events in batches of benchBatch to one
// stream on an in-process broker, with a SQLite index: claim, produce
// with acks=all, settle. Compare with BenchmarkRawProduce.
func BenchmarkAppend(b *testing.B) {
	c := kafkatest.Start(b, 1)
	be := open(b, c, streamkafka.Config{Index: filepath.Join(b.TempDir(), "index.db")})
	defer be.Close()
	ctx := context.Background()
	s, err := be.EnsureStream(ctx, "source")
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents("e", b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		res, err := be.Append(ctx, s.ID, evs[i:min(i+benchBatch, b.N)])
		if err != nil {
			b.Fatal(err)
		}
		if res[0].Duplicate || res[0].Err != nil {
			b.Fatalf("%+v", res[0])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRawProduce produces the records Append would, b.N of them in
// rounds of benchBatch, with a plain franz-go client (acks=all,
// idempotent, the same linger and partitioner) and waits for each
// round's acknowledgements, as Append does: the cost of Kafka alone.
func BenchmarkRawProduce(b *testing.B) {
	c := kafkatest.Start(b, 1)
	const topic = "raw"
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		b.Fatal(err)
	}
	evs := benchEvents("e", b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i += benchBatch {
		round := evs[i:min(i+benchBatch, b.N)]
		var wg sync.WaitGroup
		wg.Add(len(round))
		errs := make([]error, len(round))
		now := time.Now()
		for k := range round {
			ev := &round[k]
			r := &kgo.Record{Topic: topic, Key: []byte(ev.NativeID), Value: ev.Payload, Timestamp: now, Headers: []kgo.RecordHeader{
				{Key: streamkafka.HeaderType, Value: []byte(ev.Type)},
				{Key: streamkafka.HeaderOccurredAt, Value: ev.OccurredAt.UTC().AppendFormat(nil, time.RFC3339Nano)},
				{Key: streamkafka.HeaderMetadata, Value: ev.Metadata},
			}}
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) { errs[k] = err; wg.Done() })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// benchWriters is how many callers the parallel benchmarks run at once,
// as postbox's ingest does with several sources.
const benchWriters = 4

// BenchmarkAppendParallel is BenchmarkAppend with benchWriters callers
// appending to one stream at once: one caller's claim and settle run
// while another's records are in flight.
func BenchmarkAppendParallel(b *testing.B) {
	c := kafkatest.Start(b, 1)
	be := open(b, c, streamkafka.Config{Index: filepath.Join(b.TempDir(), "index.db")})
	defer be.Close()
	ctx := context.Background()
	s, err := be.EnsureStream(ctx, "source")
	if err != nil {
		b.Fatal(err)
	}
	parallel(b, func(w int, evs []stream.Event) error {
		_, err := be.Append(ctx, s.ID, evs)
		return err
	})
}

// BenchmarkRawProduceParallel is BenchmarkRawProduce with benchWriters
// callers at once on one client.
func BenchmarkRawProduceParallel(b *testing.B) {
	c := kafkatest.Start(b, 1)
	const topic = "raw"
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		b.Fatal(err)
	}
	parallel(b, func(w int, evs []stream.Event) error {
		var wg sync.WaitGroup
		wg.Add(len(evs))
		errs := make([]error, len(evs))
		now := time.Now()
		for k := range evs {
			ev := &evs[k]
			r := &kgo.Record{Topic: topic, Key: []byte(ev.NativeID), Value: ev.Payload, Timestamp: now, Headers: []kgo.RecordHeader{
				{Key: streamkafka.HeaderType, Value: []byte(ev.Type)},
				{Key: streamkafka.HeaderOccurredAt, Value: ev.OccurredAt.UTC().AppendFormat(nil, time.RFC3339Nano)},
				{Key: streamkafka.HeaderMetadata, Value: ev.Metadata},
			}}
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) { errs[k] = err; wg.Done() })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// parallel splits b.N events among benchWriters goroutines, each sending
// its share in batches of benchBatch through send.
func parallel(b *testing.B, send func(w int, evs []stream.Event) error) {
	share := (b.N + benchWriters - 1) / benchWriters
	evs := make([][]stream.Event, benchWriters)
	for w := range evs {
		evs[w] = benchEvents(fmt.Sprintf("w%d", w), max(0, min(share, b.N-w*share)))
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make([]error, benchWriters)
	for w := range benchWriters {
		wg.Go(func() {
			mine := evs[w]
			for i := 0; i < len(mine); i += benchBatch {
				if err := send(w, mine[i:min(i+benchBatch, len(mine))]); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
