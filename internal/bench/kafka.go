package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream/streamkafka"
)

// benchKafka is the Kafka side of a bench run on --streams kafka://…:
// the URL the run uses, with a prefix of its own unless the URL set one.
type benchKafka struct {
	spec   string // the --streams URL, with prefix=bench.<run>. added when it had none
	cfg    streamkafka.Config
	prefix string
	owned  bool // the bench chose the prefix, so it deletes what it made under it
}

// newBenchKafka takes spec (a kafka:// URL) and cfg, its parsed form, for
// the run run.
func newBenchKafka(spec string, cfg streamkafka.Config, run string) *benchKafka {
	bk := &benchKafka{spec: spec, cfg: cfg, prefix: cfg.Prefix}
	if bk.prefix == "" {
		bk.prefix, bk.owned = "bench."+run+".", true
		bk.spec = withPrefix(spec, bk.prefix)
		bk.cfg.Prefix = bk.prefix
	}
	return bk
}

// client returns a franz-go client of the run's brokers with opts.
func (bk *benchKafka) client(opts ...kgo.Opt) (*kgo.Client, error) {
	all := append(append([]kgo.Opt{kgo.SeedBrokers(bk.cfg.Brokers...), kgo.ClientID("postbox-bench")}, bk.cfg.Options...), opts...)
	return kgo.NewClient(all...)
}

// drop deletes the topics and consumer groups the run made under its own
// prefix, so that repeated runs do not pile up data in a shared Kafka. It
// does nothing when the URL named the prefix.
func (bk *benchKafka) drop(ctx context.Context) error {
	if !bk.owned {
		return nil
	}
	cl, err := bk.client()
	if err != nil {
		return fmt.Errorf("delete the bench's topics: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var errs []error
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list topics: %w", err))
	}
	var drop []string
	for name := range topics {
		if strings.HasPrefix(name, bk.prefix) {
			drop = append(drop, name)
		}
	}
	if len(drop) > 0 {
		if _, err := adm.DeleteTopics(ctx, drop...); err != nil {
			errs = append(errs, fmt.Errorf("delete topics: %w", err))
		}
	}
	groups, err := adm.ListGroups(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("list groups: %w", err))
	}
	var dropGroups []string
	for _, g := range groups.Groups() {
		if strings.HasPrefix(g, bk.prefix) {
			dropGroups = append(dropGroups, g)
		}
	}
	if len(dropGroups) > 0 {
		if _, err := adm.DeleteGroups(ctx, dropGroups...); err != nil {
			errs = append(errs, fmt.Errorf("delete groups: %w", err))
		}
	}
	return errors.Join(errs...)
}

// runRawKafka produces the run's events with franz-go into a fresh topic
// of the devices source, made as streamkafka makes it (one partition, the
// URL's replication factor), with acks=all and the idempotent producer,
// from one producer goroutine per device keeping at most window events
// unacknowledged, and counts what the topic holds after. No postbox
// server, no WebSocket and no identity index: the ceiling postbox on
// Kafka is measured against. A record is what streamkafka writes for an
// event without its headers: the event id as key, the envelope as value.
func runRawKafka(ctx context.Context, progress io.Writer, bk *benchKafka, rb rawBench, res *IngestResult) error {
	topic := streamkafka.TopicName(bk.prefix, server.DeviceSource)
	cl, err := bk.client(kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(0), kgo.MaxBufferedRecords(rb.devices*rb.window*2))
	if err != nil {
		return fmt.Errorf("--streams %s: %w", redact(bk.spec), err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	rf := bk.cfg.ReplicationFactor
	if rf == 0 {
		rf = streamkafka.DefaultReplicationFactor
	}
	created, err := adm.CreateTopic(ctx, 1, rf, map[string]*string{"retention.ms": kadm.StringPtr("-1")}, topic)
	if err == nil {
		err = created.Err
	}
	if err != nil {
		return fmt.Errorf("bench --raw: create topic %s: %w", topic, err)
	}

	err = rb.load(ctx, progress, res, func(ctx context.Context, device string, n int, acked, nacked *atomic.Int64, lat *latencies) error {
		return rawKafkaProducer(ctx, cl, rb, device, n, acked, nacked, lat)
	})
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	res.Stored, res.Duplicates, err = countKafkaKeys(ctx, bk, topic)
	return err
}

// rawKafkaProducer produces n events of one device in frames, keeping at
// most window events unacknowledged; a frame's latency runs from its
// first produce to its last ack.
func rawKafkaProducer(ctx context.Context, cl *kgo.Client, rb rawBench, device string, n int,
	acked, nacked *atomic.Int64, lat *latencies) error {
	slots := make(chan struct{}, max(rb.window/rb.frame, 1))
	g, gctx := errgroup.WithContext(ctx)
	ts := time.Now().UTC().Format(time.RFC3339Nano)
	for sent := 0; sent < n; sent += rb.frame {
		msgs := deviceFrame(rb.idPrefix, device, ts, rb.payload, min(rb.frame, n-sent))
		select {
		case slots <- struct{}{}:
		case <-gctx.Done():
			return g.Wait()
		}
		t0 := time.Now()
		done := make(chan error, len(msgs))
		for _, m := range msgs {
			cl.Produce(gctx, &kgo.Record{Key: []byte(m.EventID), Value: m.Envelope}, func(_ *kgo.Record, err error) { done <- err })
		}
		g.Go(func() error {
			defer func() { <-slots }()
			for range msgs {
				if err := <-done; err != nil {
					nacked.Add(1)
					return fmt.Errorf("produce: %w", err)
				}
				acked.Add(1)
			}
			lat.add(time.Since(t0), len(msgs))
			return nil
		})
	}
	return g.Wait()
}

// countKafkaKeys reads topic from its start to its end offset and returns
// its distinct keys and the records beyond one per key.
func countKafkaKeys(ctx context.Context, bk *benchKafka, topic string) (stored, dups int64, err error) {
	cl, err := bk.client(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, 0, fmt.Errorf("end offset of %s: %w", topic, err)
	}
	end, _ := ends.Lookup(topic, 0)
	seen := map[string]int{}
	var read int64
	for read < end.Offset {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return 0, 0, fmt.Errorf("read %s: %w", topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			seen[string(r.Key)]++
			read++
		})
	}
	for _, n := range seen {
		dups += int64(n - 1)
	}
	return int64(len(seen)), dups, nil
}
