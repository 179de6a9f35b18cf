package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamnats"
)

// benchNATS is the JetStream side of a bench run on --streams nats://…:
// the URL the run uses, with a prefix of its own unless the URL set one.
type benchNATS struct {
	spec   string // the --streams URL, with prefix=BENCH_<run>_ added when it had none
	cfg    streamnats.Config
	prefix string
	owned  bool // the bench chose the prefix, so it deletes what it made under it
}

// newBenchNATS reads spec (a nats:// or tls:// URL) for the run run.
func newBenchNATS(spec, run string) (*benchNATS, error) {
	cfg, err := streamnats.ParseURL(spec)
	if err != nil {
		return nil, usagef("--streams: %v", err)
	}
	bn := &benchNATS{spec: spec, cfg: cfg, prefix: cfg.Prefix}
	if bn.prefix == "" {
		bn.prefix, bn.owned = "BENCH_"+run+"_", true
		bn.spec = withPrefix(spec, bn.prefix)
		bn.cfg.Prefix = bn.prefix
	}
	return bn, nil
}

// withPrefix adds the query option prefix=prefix to the URL spec.
func withPrefix(spec, prefix string) string {
	sep := "?"
	if strings.Contains(spec, "?") {
		sep = "&"
	}
	return spec + sep + "prefix=" + prefix
}

// drop deletes the JetStream streams and the consumer bucket the run made
// under its own prefix, so that repeated runs do not pile up data in a
// shared NATS. It does nothing when the URL named the prefix.
func (bn *benchNATS) drop(ctx context.Context) error {
	if !bn.owned {
		return nil
	}
	nc, err := nats.Connect(bn.cfg.URL, append([]nats.Option{nats.Name("postbox bench")}, bn.cfg.Options...)...)
	if err != nil {
		return fmt.Errorf("delete the bench's streams: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var errs []error
	names := js.StreamNames(ctx)
	var drop []string
	for name := range names.Name() {
		if strings.HasPrefix(name, bn.prefix) || name == "KV_"+streamnats.BucketName(bn.prefix) {
			drop = append(drop, name)
		}
	}
	if err := names.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list streams: %w", err))
	}
	for _, name := range drop {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// countThroughBackend counts the run's events (native ids starting with
// prefix) in streamID by reading the whole stream through the backend on a
// consumer of its own, which it deletes afterwards: distinct identities,
// and events beyond one per identity.
func countThroughBackend(ctx context.Context, b stream.Backend, streamID, prefix string) (stored, dups int64, err error) {
	id := "bench-check-" + strings.TrimSuffix(strings.TrimPrefix(prefix, "evt_bench_"), "_")
	if _, err := b.EnsureConsumer(ctx, stream.ConsumerConfig{ID: id, StreamID: streamID, Start: stream.Start{Policy: stream.StartEarliest}}); err != nil {
		return 0, 0, err
	}
	defer b.DeleteConsumer(context.WithoutCancel(ctx), id)
	seen := map[string]int{}
	for from := int64(1); ; {
		batch, err := b.Read(ctx, id, from, 10000)
		if err != nil {
			return 0, 0, err
		}
		if len(batch.Events) == 0 {
			break
		}
		for i := range batch.Events {
			if e := &batch.Events[i]; strings.HasPrefix(e.NativeID, prefix) {
				seen[e.NativeID]++
			}
		}
		from = batch.Events[len(batch.Events)-1].Offset + 1
	}
	for _, n := range seen {
		dups += int64(n - 1)
	}
	return int64(len(seen)), dups, nil
}

// rawBench is a --raw baseline run: the bench's events written straight
// to the engine (a JetStream stream, a Kafka topic, a SQLite table) as the
// backend would make them, with no server between.
type rawBench struct {
	devices, events, frame, window int
	payload                        []byte
	idPrefix                       string
}

// load runs a --raw run's loaders: one producer per device, each sending
// its share of rb.events, with the progress lines on progress, and records
// what they measured in res.
func (rb rawBench) load(ctx context.Context, progress io.Writer, res *IngestResult,
	produce func(ctx context.Context, device string, n int, acked, nacked *atomic.Int64, lat *latencies) error) error {
	var acked, nacked atomic.Int64
	lat := &latencies{}
	start := time.Now()
	progressDone := make(chan struct{})
	go ackProgress(progress, &acked, int64(rb.events), start, progressDone)
	g, gctx := errgroup.WithContext(ctx)
	for d := 0; d < rb.devices; d++ {
		n := rb.events / rb.devices
		if d < rb.events%rb.devices {
			n++
		}
		device := fmt.Sprintf("bench-%03d", d)
		g.Go(func() error { return produce(gctx, device, n, &acked, &nacked, lat) })
	}
	err := g.Wait()
	close(progressDone)
	res.measured(start, &acked, &nacked, lat)
	return err
}

// runRawJetStream publishes the run's events with JetStream async publish
// into a fresh stream of the devices source, created through streamnats
// (so with its settings: file storage, its replicas, one subject per event
// under the stream's name), from one producer per device keeping at most
// window events unacknowledged, and counts what the stream holds after.
// No postbox server, no WebSocket and no Nats-Expected-Last-Subject-Sequence
// header: the ceiling postbox on JetStream is measured against.
func runRawJetStream(ctx context.Context, progress io.Writer, bn *benchNATS, rb rawBench, res *IngestResult) error {
	be, err := streamnats.Open(ctx, bn.cfg)
	if err != nil {
		return fmt.Errorf("--streams %s: %w", redact(bn.spec), err)
	}
	defer be.Close()
	if _, err := be.EnsureStream(ctx, server.DeviceSource); err != nil {
		return err
	}
	name := streamnats.StreamName(bn.prefix, server.DeviceSource)
	maxPending := bn.cfg.MaxPending
	if maxPending == 0 {
		maxPending = streamnats.DefaultMaxPending
	}
	ackTimeout := bn.cfg.AckTimeout
	if ackTimeout == 0 {
		ackTimeout = streamnats.DefaultAckTimeout
	}
	js, err := jetstream.New(be.Conn(), jetstream.WithPublishAsyncMaxPending(maxPending), jetstream.WithPublishAsyncTimeout(ackTimeout))
	if err != nil {
		return err
	}

	err = rb.load(ctx, progress, res, func(ctx context.Context, device string, n int, acked, nacked *atomic.Int64, lat *latencies) error {
		return rawProducer(ctx, js, name+".", rb, device, n, acked, nacked, lat)
	})
	if err != nil {
		return fmt.Errorf("bench --raw: %w", err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("bench --raw: stream %s: %w", name, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bench --raw: stream %s: %w", name, err)
	}
	// One subject per event: distinct subjects are distinct events.
	res.Stored, res.Duplicates = int64(info.State.NumSubjects), int64(info.State.Msgs)-int64(info.State.NumSubjects)
	return nil
}

// rawProducer publishes n events of one device in frames, each event on
// subject prefix+<32 hex digits of sha256(event id)> (as long as
// streamnats's identity subjects), keeping at most window events
// unacknowledged; a frame's latency runs from its first publish to its
// last ack.
func rawProducer(ctx context.Context, js jetstream.JetStream, subjectPrefix string, rb rawBench, device string, n int,
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
		futures := make([]jetstream.PubAckFuture, len(msgs))
		for i, m := range msgs {
			sum := sha256.Sum256([]byte(m.EventID))
			msg := &nats.Msg{Subject: subjectPrefix + hex.EncodeToString(sum[:16]), Data: m.Envelope}
			for {
				f, err := js.PublishMsgAsync(msg)
				if errors.Is(err, jetstream.ErrTooManyStalledMsgs) && gctx.Err() == nil {
					continue
				}
				if err != nil {
					<-slots
					return errors.Join(fmt.Errorf("publish: %w", err), g.Wait())
				}
				futures[i] = f
				break
			}
		}
		g.Go(func() error {
			defer func() { <-slots }()
			for _, f := range futures {
				select {
				case <-f.Ok():
					acked.Add(1)
				case err := <-f.Err():
					nacked.Add(1)
					return fmt.Errorf("publish ack: %w", err)
				case <-gctx.Done():
					return gctx.Err()
				}
			}
			lat.add(time.Since(t0), len(futures))
			return nil
		})
	}
	return g.Wait()
}
