package streamkafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-events/postbox/stream"
)

// DefaultReadLimit is the limit of a Read asked for 0 events; MaxReadLimit
// bounds every Read.
const (
	DefaultReadLimit = 1000
	MaxReadLimit     = 10000
)

// fetchBytes is how many bytes one fetch asks for.
const fetchBytes = 4 << 20

var decompressor = kgo.DefaultDecompressor()

// leader is where partition 0 of a topic is served.
type leader struct {
	node int32
	id   [16]byte // the topic's id, which fetches name it by
}

// leaderOf returns the leader of topic's partition, from memory or from
// the brokers' metadata.
func (b *Backend) leaderOf(ctx context.Context, topic string) (leader, error) {
	b.mu.Lock()
	l, ok := b.leaders[topic]
	b.mu.Unlock()
	if ok {
		return l, nil
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, b.cl)
	if err != nil {
		return l, err
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return l, err
		}
		for _, p := range t.Partitions {
			if p.Partition != 0 {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return l, err
			}
			if p.Leader < 0 {
				return l, kerr.LeaderNotAvailable
			}
			l = leader{node: p.Leader, id: t.TopicID}
			b.mu.Lock()
			b.leaders[topic] = l
			b.mu.Unlock()
			return l, nil
		}
	}
	return l, kerr.UnknownTopicOrPartition
}

func (b *Backend) forgetLeader(topic string) {
	b.mu.Lock()
	delete(b.leaders, topic)
	b.mu.Unlock()
}

// fetch fetches the records of st from Kafka offset off on, as many as
// fit in fetchBytes, without waiting for any: it returns the records
// there are now, and the partition's high watermark and log start. An
// offset out of the partition's range is kerr.OffsetOutOfRange.
func (b *Backend) fetch(ctx context.Context, st *streamState, off int64) (kgo.FetchPartition, error) {
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return kgo.FetchPartition{}, ctx.Err()
			case <-b.closed:
				return kgo.FetchPartition{}, errors.New("the backend is closed")
			case <-time.After(time.Duration(min(attempt*20, 250)) * time.Millisecond):
			}
		}
		l, err := b.leaderOf(ctx, st.topic)
		if err != nil {
			if lastErr = err; ctx.Err() != nil || !retriable(err) {
				return kgo.FetchPartition{}, err
			}
			continue
		}
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis = 0
		req.MinBytes = 1
		req.MaxBytes = fetchBytes
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = st.topic, l.id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = 0, off, fetchBytes
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		kresp, err := b.cl.Broker(int(l.node)).Request(ctx, req)
		if err != nil {
			b.forgetLeader(st.topic)
			if lastErr = err; ctx.Err() != nil {
				return kgo.FetchPartition{}, err
			}
			continue
		}
		resp := kresp.(*kmsg.FetchResponse)
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			b.forgetLeader(st.topic)
			lastErr = err
			continue
		}
		var part *kmsg.FetchResponseTopicPartition
		for i := range resp.Topics {
			for j := range resp.Topics[i].Partitions {
				if resp.Topics[i].Partitions[j].Partition == 0 {
					part = &resp.Topics[i].Partitions[j]
				}
			}
		}
		if part == nil {
			b.forgetLeader(st.topic)
			lastErr = fmt.Errorf("fetch %s: no partition 0 in the response", st.topic)
			continue
		}
		fp, _ := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: off, Topic: st.topic, Partition: 0}, part, decompressor, nil)
		if fp.Err != nil && retriable(fp.Err) {
			b.forgetLeader(st.topic)
			lastErr = fp.Err
			continue
		}
		return fp, fp.Err
	}
	return kgo.FetchPartition{}, fmt.Errorf("fetch %s at %d: %w", st.topic, off, lastErr)
}

// retriable reports whether a fetch failing with err may pass on
// another try, after the leader is looked up again.
func retriable(err error) bool {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable || errors.Is(err, kerr.UnknownTopicID)
	}
	return true // connection errors
}

// listed runs list, a kadm offsets listing of st's topic, and returns
// partition 0's offset, retrying as retrying does.
func (b *Backend) listed(ctx context.Context, st *streamState, what string, list func(context.Context) (kadm.ListedOffsets, error)) (kadm.ListedOffset, error) {
	var o kadm.ListedOffset
	err := b.retrying(ctx, func(ctx context.Context) error {
		all, err := list(ctx)
		if err != nil {
			return err
		}
		var ok bool
		if o, ok = all.Lookup(st.topic, 0); !ok {
			return fmt.Errorf("no offset for %s", st.topic)
		}
		return o.Err
	})
	if err != nil {
		return kadm.ListedOffset{}, fmt.Errorf("stream %s: %s: %w", st.id, what, err)
	}
	return o, nil
}

// retrying runs call, a request through kadm, until it succeeds, fails
// for good, or about 15 s of tries have passed. An error that a new
// leader or coordinator may end (a broker left, its connections closed
// under the client) refreshes the client's metadata, which kadm's
// requests are routed by, and tries again.
func (b *Backend) retrying(ctx context.Context, call func(context.Context) error) error {
	var err error
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			b.cl.ForceMetadataRefresh()
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (after %v)", ctx.Err(), err)
			case <-b.closed:
				return errors.New("the backend is closed")
			case <-time.After(time.Duration(min(attempt*50, 500)) * time.Millisecond):
			}
		}
		if err = call(ctx); err == nil || ctx.Err() != nil || !retriable(err) || attempt == 40 {
			return err
		}
	}
}

// offsets returns the log start and end (high watermark) offsets of st's
// partition, Kafka's.
func (b *Backend) offsets(ctx context.Context, st *streamState) (start, end int64, err error) {
	e, err := b.listed(ctx, st, "end offset", func(ctx context.Context) (kadm.ListedOffsets, error) { return b.adm.ListEndOffsets(ctx, st.topic) })
	if err != nil {
		return 0, 0, err
	}
	s, err := b.listed(ctx, st, "start offset", func(ctx context.Context) (kadm.ListedOffsets, error) { return b.adm.ListStartOffsets(ctx, st.topic) })
	if err != nil {
		return 0, 0, err
	}
	st.grow(e.Offset)
	return s.Offset, e.Offset, nil
}

// endOffset returns the end offset (high watermark) of st's partition.
func (b *Backend) endOffset(ctx context.Context, st *streamState) (int64, error) {
	e, err := b.listed(ctx, st, "end offset", func(ctx context.Context) (kadm.ListedOffsets, error) { return b.adm.ListEndOffsets(ctx, st.topic) })
	if err != nil {
		return 0, err
	}
	st.grow(e.Offset)
	return e.Offset, nil
}

// offsetAfter returns the first Kafka offset of st stored at or after t,
// or, when there is none, the end offset as it was before the search.
// kadm answers "none" with an end offset it reads after the search, and a
// record appended in between is stored after t: passing it would make
// Trim delete events newer than its time. So an answer past the end read
// before is taken as that end: between the two are only records appended
// while the search ran.
func (b *Backend) offsetAfter(ctx context.Context, st *streamState, t time.Time) (int64, error) {
	end, err := b.endOffset(ctx, st)
	if err != nil {
		return 0, err
	}
	ms := t.UnixMilli()
	if t.After(time.UnixMilli(ms)) {
		ms++ // a record of the millisecond t is in was stored before t
	}
	o, err := b.listed(ctx, st, fmt.Sprintf("offset after %v", t), func(ctx context.Context) (kadm.ListedOffsets, error) {
		return b.adm.ListOffsetsAfterMilli(ctx, ms, st.topic)
	})
	if err != nil {
		return 0, err
	}
	if o.Offset < 0 || o.Offset > end {
		return end, nil
	}
	return o.Offset, nil
}

// scan calls fn with each record of st stored from about t to the end
// offset as it is when scan starts, until fn returns false.
func (b *Backend) scan(ctx context.Context, st *streamState, t time.Time, fn func(*kgo.Record) bool) error {
	from, err := b.offsetAfter(ctx, st, t)
	if err != nil {
		return err
	}
	end, err := b.endOffset(ctx, st)
	if err != nil {
		return err
	}
	for off := from; off < end; {
		fp, err := b.fetch(ctx, st, off)
		if errors.Is(err, kerr.OffsetOutOfRange) {
			start, _, err := b.offsets(ctx, st)
			if err != nil {
				return err
			}
			if off < start {
				off = start
				continue
			}
			return nil
		}
		if err != nil {
			return err
		}
		if len(fp.Records) == 0 {
			return nil
		}
		for _, r := range fp.Records {
			if r.Offset >= end {
				return nil
			}
			if !fn(r) {
				return nil
			}
			off = r.Offset + 1
		}
	}
	return nil
}

// Event implements stream.Backend.
func (b *Backend) Event(ctx context.Context, streamID string, offset int64) (stream.StoredEvent, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return stream.StoredEvent{}, err
	}
	if offset < 1 {
		return stream.StoredEvent{}, fmt.Errorf("%w: offset %d in %s", stream.ErrNotFound, offset, streamID)
	}
	fp, err := b.fetch(ctx, st, offset-1)
	if errors.Is(err, kerr.OffsetOutOfRange) {
		return stream.StoredEvent{}, fmt.Errorf("%w: offset %d in %s", stream.ErrNotFound, offset, streamID)
	}
	if err != nil {
		return stream.StoredEvent{}, fmt.Errorf("event %d of %s: %w", offset, streamID, err)
	}
	for _, r := range fp.Records {
		if r.Offset == offset-1 {
			return decode(&st.streamRow, r)
		}
	}
	return stream.StoredEvent{}, fmt.Errorf("%w: offset %d in %s", stream.ErrNotFound, offset, streamID)
}

// Lookup implements stream.Backend: the index's row, then the record at
// its offset. A row whose claim expired is resolved first, as Append
// would: found in the topic, it takes the record's offset; not found, it
// is deleted, since its event can no longer be stored.
func (b *Backend) Lookup(ctx context.Context, streamID, nativeID, variant string) (stream.StoredEvent, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return stream.StoredEvent{}, err
	}
	id := identity{nativeID, variant}
	rows, err := b.idx.rows(ctx, b.idx.db, streamID, []identity{id})
	if err != nil {
		return stream.StoredEvent{}, fmt.Errorf("look up %s in %s: %w", nativeID, streamID, err)
	}
	r, ok := rows[id]
	switch {
	case !ok:
		return stream.StoredEvent{}, fmt.Errorf("%w: %s/%s in %s", stream.ErrNotFound, nativeID, variant, streamID)
	case r.stored():
	case r.expired():
		offset, err := b.resolveExpired(ctx, st, r)
		if err != nil {
			return stream.StoredEvent{}, fmt.Errorf("look up %s in %s: %w", nativeID, streamID, err)
		}
		if offset == 0 {
			return stream.StoredEvent{}, fmt.Errorf("%w: %s/%s in %s", stream.ErrNotFound, nativeID, variant, streamID)
		}
		r.offset = offset
	default:
		return stream.StoredEvent{}, fmt.Errorf("%w: %s/%s in %s (being appended)", stream.ErrNotFound, nativeID, variant, streamID)
	}
	e, err := b.Event(ctx, streamID, r.offset)
	if err == nil && (e.NativeID != nativeID || e.Variant != variant) {
		return stream.StoredEvent{}, fmt.Errorf("look up %s/%s in %s: the index says offset %d, which holds %s/%s", nativeID, variant, streamID, r.offset, e.NativeID, e.Variant)
	}
	return e, err
}

// resolveExpired takes over the expired claim r and settles it from the
// topic: the offset of its record, or 0 (and the row deleted) when the
// topic does not hold it.
func (b *Backend) resolveExpired(ctx context.Context, st *streamState, r *idRow) (int64, error) {
	token := newToken()
	var ok bool
	err := b.idx.tx(ctx, func(tx *sql.Tx) error {
		var err error
		ok, err = b.idx.takeOver(ctx, tx, st.id, token, b.cfg.ClaimTimeout, claimRequest{identity: r.identity, typ: r.typ, hash: r.hash}, r.token)
		return err
	})
	if err != nil || !ok {
		return 0, err
	}
	s := settled{identity: r.identity}
	err = b.scan(ctx, st, fromMicros(r.claimedAt).Add(-scanMargin), func(rec *kgo.Record) bool {
		if !holds(rec, r.identity) {
			return true
		}
		s.offset, s.storedAt = rec.Offset+1, rec.Timestamp
		s.typ, s.hash = string(header(rec, HeaderType)), payloadHash(rec.Value)
		return false
	})
	if err != nil {
		return 0, err
	}
	s.own = true
	return s.offset, b.idx.settle(ctx, st.id, token, []settled{s}, false)
}

// readBuffer is what a consumer's last fetch brought beyond its Read:
// a Read that continues where the previous one ended starts from it.
type readBuffer struct {
	mu    sync.Mutex
	topic string
	next  int64 // the Kafka offset the first of recs, or the next fetch, has
	recs  []*kgo.Record
	hw    int64 // the high watermark the buffer was fetched at
}

func (b *Backend) readBuffer(id string) *readBuffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	rb := b.readers[id]
	if rb == nil {
		rb = &readBuffer{}
		b.readers[id] = rb
	}
	return rb
}

func (b *Backend) dropReader(id string) {
	b.mu.Lock()
	delete(b.readers, id)
	b.mu.Unlock()
}

// Read implements stream.Backend. It fetches without waiting: it returns
// the events the partition holds now, up to limit.
func (b *Backend) Read(ctx context.Context, consumerID string, from int64, limit int) (stream.Batch, error) {
	c, err := b.Consumer(ctx, consumerID)
	if err != nil {
		return stream.Batch{}, err
	}
	if from == 0 {
		from = c.NextOffset
	}
	if from < 1 {
		return stream.Batch{}, fmt.Errorf("%w: read from %d", stream.ErrOffsetOutOfRange, from)
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	st, err := b.stream(ctx, c.StreamID)
	if err != nil {
		return stream.Batch{}, err
	}
	rb := b.readBuffer(consumerID)
	rb.mu.Lock()
	defer rb.mu.Unlock()
	off := from - 1
	recs := make([]*kgo.Record, 0, min(limit, 256))
	hw := int64(-1)
	if rb.topic == st.topic && rb.next == off && len(rb.recs) > 0 {
		n := min(limit, len(rb.recs))
		recs = append(recs, rb.recs[:n]...)
		rb.recs = rb.recs[n:]
		off = recs[n-1].Offset + 1
		hw = max(rb.hw, st.last.Load())
	} else {
		rb.recs = nil
	}
	for len(recs) < limit && (hw < 0 || off < hw) {
		fp, err := b.fetch(ctx, st, off)
		if errors.Is(err, kerr.OffsetOutOfRange) {
			start, end, err := b.offsets(ctx, st)
			if err != nil {
				return stream.Batch{}, err
			}
			if off < start {
				off = start
				continue
			}
			hw = end
			break
		}
		if err != nil {
			return stream.Batch{}, fmt.Errorf("read %s from %d: %w", st.id, off+1, err)
		}
		hw = fp.HighWatermark
		st.grow(hw)
		if len(fp.Records) == 0 {
			break
		}
		n := min(limit-len(recs), len(fp.Records))
		recs = append(recs, fp.Records[:n]...)
		off = fp.Records[n-1].Offset + 1
		rb.recs, rb.hw = fp.Records[n:], hw
	}
	rb.topic, rb.next = st.topic, off
	batch := stream.Batch{Consumer: c, HighWatermark: max(hw, 0), Events: make([]stream.StoredEvent, 0, len(recs))}
	for _, r := range recs {
		e, err := decode(&st.streamRow, r)
		if err != nil {
			rb.recs = nil
			return stream.Batch{}, err
		}
		batch.Events = append(batch.Events, e)
	}
	return batch, nil
}

// Stats implements stream.Backend: the offsets from the broker, the
// times from the first and last records.
func (b *Backend) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return stream.Stats{}, err
	}
	start, end, err := b.offsets(ctx, st)
	if err != nil {
		return stream.Stats{}, err
	}
	out := stream.Stats{StreamID: streamID, Events: end - start, LastOffset: end}
	if end <= start {
		return out, nil
	}
	out.FirstOffset = start + 1
	first, err := b.Event(ctx, streamID, start+1)
	if err != nil {
		return stream.Stats{}, fmt.Errorf("stats of %s: %w", streamID, err)
	}
	last, err := b.Event(ctx, streamID, end)
	if err != nil {
		return stream.Stats{}, fmt.Errorf("stats of %s: %w", streamID, err)
	}
	out.FirstStoredAt, out.LastStoredAt = first.StoredAt, last.StoredAt
	return out, nil
}

// Lag implements stream.Backend.
func (b *Backend) Lag(ctx context.Context, consumerID string) (stream.Lag, error) {
	c, err := b.Consumer(ctx, consumerID)
	if err != nil {
		return stream.Lag{}, err
	}
	st, err := b.stream(ctx, c.StreamID)
	if err != nil {
		return stream.Lag{}, err
	}
	end, err := b.endOffset(ctx, st)
	if err != nil {
		return stream.Lag{}, err
	}
	l := stream.Lag{ConsumerID: consumerID, StreamID: c.StreamID, NextOffset: c.NextOffset, HighWatermark: end}
	l.Events = stream.LagOf(l.NextOffset, l.HighWatermark)
	return l, nil
}

// waitPoll is how often Wait asks the broker for the end offset: appends
// of other processes are seen within it; this Backend's own wake Wait
// at once.
const waitPoll = 100 * time.Millisecond

// Wait implements stream.Waiter.
func (b *Backend) Wait(ctx context.Context, streamID string, after int64) error {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return err
	}
	t := time.NewTicker(waitPoll)
	defer t.Stop()
	for {
		grew := st.grown()
		if st.last.Load() > after {
			return nil
		}
		end, err := b.endOffset(ctx, st)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil && end > after {
			return nil
		}
		if err != nil {
			b.log.Warn("streamkafka: wait: end offset", "stream", streamID, "err", err)
		}
		select {
		case <-grew:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.closed:
			return errors.New("wait: the backend is closed")
		}
	}
}

// Trim implements stream.Trimmer with DeleteRecords: it moves the
// partition's log start up to the first offset that is stored at or
// after t, that a consumer of the stream has not committed, or that is
// limit past the start, whichever is first, and deletes the index rows
// of the events before it.
func (b *Backend) Trim(ctx context.Context, streamID string, t time.Time, limit int) (int, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	start, _, err := b.offsets(ctx, st)
	if err != nil {
		return 0, err
	}
	upTo, err := b.offsetAfter(ctx, st, t)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	cs, err := b.consumersOf(ctx, streamID)
	if err != nil {
		return 0, fmt.Errorf("trim %s: consumers: %w", streamID, err)
	}
	for _, c := range cs {
		upTo = min(upTo, c.NextOffset-1)
	}
	upTo = min(upTo, start+int64(limit))
	if upTo <= start {
		return 0, nil
	}
	resp, err := b.adm.DeleteRecords(ctx, kadm.Offsets{st.topic: {0: {Topic: st.topic, Partition: 0, At: upTo, LeaderEpoch: -1}}})
	if err != nil {
		return 0, fmt.Errorf("trim %s: delete records: %w", streamID, err)
	}
	if r, ok := resp.Lookup(st.topic, 0); !ok || r.Err != nil {
		return 0, fmt.Errorf("trim %s: delete records below %d: %v", streamID, upTo, r.Err)
	}
	if err := b.idx.deleteBelow(ctx, streamID, upTo+1); err != nil {
		// The records are gone; their rows only make redeliveries
		// Duplicates of events no longer there, until the next Trim.
		return int(upTo - start), fmt.Errorf("trim %s: index: %w", streamID, err)
	}
	return int(upTo - start), nil
}

// ReadFrom implements stream.Scanner: it fetches from the partition
// without a consumer and without waiting, up to the high watermark it
// finds.
func (b *Backend) ReadFrom(ctx context.Context, streamID string, from int64, limit int) ([]stream.StoredEvent, error) {
	if from < 1 {
		return nil, fmt.Errorf("%w: read from %d", stream.ErrOffsetOutOfRange, from)
	}
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return nil, err
	}
	off := from - 1
	events := make([]stream.StoredEvent, 0, min(limit, 256))
	for len(events) < limit {
		fp, err := b.fetch(ctx, st, off)
		if errors.Is(err, kerr.OffsetOutOfRange) {
			start, _, err := b.offsets(ctx, st)
			if err != nil {
				return nil, err
			}
			if off < start {
				off = start
				continue
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s from %d: %w", st.id, off+1, err)
		}
		st.grow(fp.HighWatermark)
		if len(fp.Records) == 0 {
			break
		}
		n := min(limit-len(events), len(fp.Records))
		for _, r := range fp.Records[:n] {
			e, err := decode(&st.streamRow, r)
			if err != nil {
				return nil, err
			}
			events = append(events, e)
		}
		off = fp.Records[n-1].Offset + 1
		if off >= fp.HighWatermark {
			break
		}
	}
	return events, nil
}
