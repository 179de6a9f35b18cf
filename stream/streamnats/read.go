package streamnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/stream"
)

// DefaultReadLimit is the limit of a Read asked for 0 events; MaxReadLimit
// bounds every Read.
const (
	DefaultReadLimit = 1000
	MaxReadLimit     = 10000
)

// state returns the stream's JetStream state, and records its last
// sequence.
func (b *Backend) state(ctx context.Context, st *streamState) (jetstream.StreamState, error) {
	info, err := st.js.Info(ctx)
	if err != nil {
		return jetstream.StreamState{}, fmt.Errorf("stream %s: %w", st.ID, mapErr(err))
	}
	st.grow(info.State.LastSeq)
	return info.State, nil
}

// firstSeq is the oldest sequence the stream holds, or the next one when
// it holds none.
func firstSeq(s jetstream.StreamState) uint64 {
	if s.Msgs == 0 {
		return s.LastSeq + 1
	}
	return s.FirstSeq
}

// startOffset returns the next offset of a consumer of st starting at
// start.
func (b *Backend) startOffset(ctx context.Context, st *streamState, start stream.Start) (int64, error) {
	s, err := b.state(ctx, st)
	if err != nil {
		return 0, err
	}
	first := int64(firstSeq(s))
	switch start.Policy {
	case "", stream.StartLatest:
		return int64(s.LastSeq) + 1, nil
	case stream.StartEarliest:
		return first, nil
	case stream.StartAtOffset:
		if start.Offset > int64(s.LastSeq)+1 {
			return 0, fmt.Errorf("%w: start at %d, past the next offset %d of %s", stream.ErrOffsetOutOfRange, start.Offset, s.LastSeq+1, st.ID)
		}
		return max(start.Offset, first), nil // what was trimmed is gone
	case stream.StartAtTime:
		seq, err := b.seqAt(ctx, st, uint64(first), s.LastSeq, start.Time)
		return int64(seq), err
	}
	return 0, stream.ErrInvalidStart
}

// seqAt returns the first sequence in [first, last] stored at or after t,
// or last+1. Stored times never decrease along the sequences one Backend
// wrote, so it is a binary search: about 20 gets for a million events.
// A deleted sequence counts as the next message's.
func (b *Backend) seqAt(ctx context.Context, st *streamState, first, last uint64, t time.Time) (uint64, error) {
	lo, hi := first, last+1 // the answer is in [lo, hi]
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := st.js.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(st.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("find %v in %s: %w", t, st.ID, mapErr(err))
		}
		if !storedAt(m.Header, m.Time).Before(t) {
			hi = min(mid, m.Sequence)
		} else {
			lo = m.Sequence + 1
		}
	}
	return lo, nil
}

// reader is the ordered consumer a postbox consumer's reads continue on.
// It runs with Consume, whose handler hands each message to msgs: taking
// messages from a channel costs far less per message than
// MessagesContext.Next, which arms and stops a heartbeat timer on every
// call. The handler blocks while msgs is full, so a reader holds at most
// readerBuffer messages plus one pull batch however far behind its Reads
// are. A reader that stays full longer than two heartbeats (10 s) is
// reset by the ordered consumer (a new JetStream consumer from the last
// message handled); the blocked handler's send is queued on msgs before
// any of the new consumer's, so the order holds.
type reader struct {
	mu     sync.Mutex
	stream string // JetStream stream name
	next   uint64 // the sequence the next message will have
	feed   atomic.Pointer[feed]
}

// feed is one running ordered consumer of a reader.
type feed struct {
	cc     jetstream.ConsumeContext
	msgs   chan jetstream.Msg
	done   chan struct{} // closed by stop: unblocks the handler
	closed <-chan struct{}
	once   sync.Once
}

func (f *feed) stop() {
	f.once.Do(func() {
		close(f.done)
		f.cc.Stop()
	})
}

// readerBuffer is the capacity of a reader's msgs and its pull batch.
const readerBuffer = 1000

// stop stops r's feed. Close calls it without r.mu, while a Read may be
// waiting on the feed: that Read then ends with an error.
func (r *reader) stop() {
	if f := r.feed.Swap(nil); f != nil {
		f.stop()
	}
}

func (b *Backend) dropReader(id string) {
	b.readersMu.Lock()
	r := b.readers[id]
	delete(b.readers, id)
	b.readersMu.Unlock()
	if r != nil {
		r.mu.Lock()
		r.stop()
		r.mu.Unlock()
	}
}

// Read implements stream.Backend.
func (b *Backend) Read(ctx context.Context, consumerID string, from int64, limit int) (stream.Batch, error) {
	rec, _, err := b.getConsumer(ctx, consumerID)
	if err != nil {
		return stream.Batch{}, err
	}
	c := rec.consumer()
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
	s, err := b.state(ctx, st)
	if err != nil {
		return stream.Batch{}, err
	}
	batch := stream.Batch{Consumer: c, HighWatermark: int64(s.LastSeq), Events: []stream.StoredEvent{}}
	start := max(uint64(from), firstSeq(s))
	if start > s.LastSeq {
		return batch, nil
	}
	b.readersMu.Lock()
	r := b.readers[consumerID]
	if r == nil {
		r = &reader{}
		b.readers[consumerID] = r
	}
	b.readersMu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	batch.Events, err = b.readFrom(ctx, r, st, start, s.LastSeq, limit)
	return batch, err
}

// readFrom reads up to limit events of st from start to last on r,
// starting a new ordered consumer when r is not at start.
func (b *Backend) readFrom(ctx context.Context, r *reader, st *streamState, start, last uint64, limit int) ([]stream.StoredEvent, error) {
	f := r.feed.Load()
	if f == nil || r.stream != st.name || r.next != start {
		r.stop()
		cons, err := st.js.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:   start,
		})
		if err != nil {
			return nil, fmt.Errorf("read %s from %d: %w", st.ID, start, mapErr(err))
		}
		msgs, done := make(chan jetstream.Msg, readerBuffer), make(chan struct{})
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- m:
			case <-done:
			}
		}, jetstream.PullMaxMessages(readerBuffer))
		if err != nil {
			return nil, fmt.Errorf("read %s from %d: %w", st.ID, start, mapErr(err))
		}
		f = &feed{cc: cc, msgs: msgs, done: done, closed: cc.Closed()}
		r.stream, r.next = st.name, start
		r.feed.Store(f)
	}
	n := min(uint64(limit), last-start+1)
	events := make([]stream.StoredEvent, 0, n)
	types := map[string]string{}
	prefix := st.ID + "/"
	for uint64(len(events)) < n {
		var m jetstream.Msg
		select {
		case m = <-f.msgs:
		case <-f.closed:
			r.stop()
			return nil, fmt.Errorf("read %s: the ordered consumer stopped", st.ID)
		case <-ctx.Done():
			r.stop()
			return nil, fmt.Errorf("read %s: %w", st.ID, ctx.Err())
		}
		seq, ts, ok := ackInfo(m.Reply())
		if !ok {
			meta, err := m.Metadata()
			if err != nil {
				r.stop()
				return nil, fmt.Errorf("read %s: %w", st.ID, err)
			}
			seq, ts = meta.Sequence.Stream, meta.Timestamp.UnixNano()
		}
		if seq < r.next {
			continue // already read: only after a reset, should one deliver twice
		}
		r.next = seq + 1
		var e stream.StoredEvent
		if err := decode(&e, m.Headers(), m.Data(), types); err != nil {
			r.stop()
			return nil, fmt.Errorf("message %d of %s: %w", seq, st.name, err)
		}
		if e.StoredAt.IsZero() {
			e.StoredAt = time.Unix(0, ts).UTC()
		}
		e.Offset = int64(seq)
		e.ID = prefix + strconv.FormatUint(seq, 10)
		e.StreamID, e.SourceID = st.ID, st.SourceID
		events = append(events, e)
		if seq >= last {
			break
		}
	}
	return events, nil
}

// ackInfo reads the stream sequence and the timestamp (unix nanoseconds)
// from the reply subject of a message delivered by a consumer,
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>
// or its longer form with domain and account hash after $JS.ACK, without
// the allocations of jetstream.Msg.Metadata. ok is false for any other
// form.
func ackInfo(reply string) (seq uint64, ts int64, ok bool) {
	const prefix = "$JS.ACK."
	if len(reply) <= len(prefix) || reply[:len(prefix)] != prefix {
		return 0, 0, false
	}
	var tokens [12]string
	n := 0
	for s := reply[len(prefix):]; ; n++ {
		if n == len(tokens) {
			return 0, 0, false
		}
		i := strings.IndexByte(s, '.')
		if i < 0 {
			tokens[n] = s
			n++
			break
		}
		tokens[n], s = s[:i], s[i+1:]
	}
	var seqTok, tsTok string
	switch {
	case n == 7: // stream, consumer, delivered, stream seq, consumer seq, time, pending
		seqTok, tsTok = tokens[3], tokens[5]
	case n >= 9: // domain, account hash, then as above (and perhaps a random token)
		seqTok, tsTok = tokens[5], tokens[7]
	default:
		return 0, 0, false
	}
	seq, err := strconv.ParseUint(seqTok, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	ts, err = strconv.ParseInt(tsTok, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return seq, ts, true
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
	m, err := st.js.GetMsg(ctx, uint64(offset))
	if err != nil {
		return stream.StoredEvent{}, fmt.Errorf("event %d of %s: %w", offset, streamID, mapErr(err))
	}
	return st.stored(m)
}

// Lookup implements stream.Backend.
func (b *Backend) Lookup(ctx context.Context, streamID, nativeID, variant string) (stream.StoredEvent, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return stream.StoredEvent{}, err
	}
	m, err := st.js.GetLastMsgForSubject(ctx, st.name+"."+identityToken(nativeID, variant))
	if err != nil {
		return stream.StoredEvent{}, fmt.Errorf("look up %s in %s: %w", nativeID, streamID, mapErr(err))
	}
	e, err := st.stored(m)
	if err == nil && (e.NativeID != nativeID || e.Variant != variant) {
		return stream.StoredEvent{}, fmt.Errorf("%w: %s in %s", stream.ErrNotFound, nativeID, streamID)
	}
	return e, err
}

func (st *streamState) stored(m *jetstream.RawStreamMsg) (stream.StoredEvent, error) {
	var e stream.StoredEvent
	if err := decode(&e, m.Header, m.Data, nil); err != nil {
		return e, fmt.Errorf("message %d of %s: %w", m.Sequence, st.name, err)
	}
	if e.StoredAt.IsZero() {
		e.StoredAt = m.Time.UTC()
	}
	e.Offset = int64(m.Sequence)
	e.ID = st.ID + "/" + strconv.FormatUint(m.Sequence, 10)
	e.StreamID, e.SourceID = st.ID, st.SourceID
	return e, nil
}

// Stats implements stream.Backend: the counts from JetStream's stream
// state, the times from its first and last messages.
func (b *Backend) Stats(ctx context.Context, streamID string) (stream.Stats, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return stream.Stats{}, err
	}
	s, err := b.state(ctx, st)
	if err != nil {
		return stream.Stats{}, err
	}
	out := stream.Stats{StreamID: streamID, Events: int64(s.Msgs), LastOffset: int64(s.LastSeq)}
	if s.Msgs == 0 {
		return out, nil
	}
	out.FirstOffset = int64(s.FirstSeq)
	out.FirstStoredAt, out.LastStoredAt = s.FirstTime.UTC(), s.LastTime.UTC()
	if m, err := st.js.GetMsg(ctx, s.FirstSeq, jetstream.WithGetMsgSubject(st.subject)); err == nil {
		out.FirstStoredAt = storedAt(m.Header, m.Time)
	}
	if m, err := st.js.GetMsg(ctx, s.LastSeq); err == nil {
		out.LastStoredAt = storedAt(m.Header, m.Time)
	}
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
	s, err := b.state(ctx, st)
	if err != nil {
		return stream.Lag{}, err
	}
	l := stream.Lag{ConsumerID: consumerID, StreamID: c.StreamID, NextOffset: c.NextOffset, HighWatermark: int64(s.LastSeq)}
	l.Events = stream.LagOf(l.NextOffset, l.HighWatermark)
	return l, nil
}

// Wait implements stream.Waiter. It listens on the stream's subjects
// (core NATS, so it hears appends from every process) and to this
// Backend's own acks, and asks JetStream for the last sequence only when
// one of them says something was published.
func (b *Backend) Wait(ctx context.Context, streamID string, after int64) error {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return err
	}
	if int64(st.last.Load()) > after {
		return nil
	}
	heard := make(chan struct{}, 1)
	sub, err := b.nc.Subscribe(st.subject, func(*nats.Msg) {
		select {
		case heard <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("wait on %s: %w", streamID, err)
	}
	defer sub.Unsubscribe()
	for {
		st.mu.Lock()
		grew := st.grew
		st.mu.Unlock()
		if int64(st.last.Load()) > after {
			return nil
		}
		s, err := b.state(ctx, st)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if int64(s.LastSeq) > after {
			return nil
		}
		select {
		case <-heard:
		case <-grew:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Trim implements stream.Trimmer with a JetStream purge up to a sequence,
// which keeps the stream's sequence numbering.
func (b *Backend) Trim(ctx context.Context, streamID string, t time.Time, limit int) (int, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	s, err := b.state(ctx, st)
	if err != nil {
		return 0, err
	}
	first := firstSeq(s)
	end, err := b.seqAt(ctx, st, first, s.LastSeq, t) // the first sequence stored at or after t
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	read, ok, err := b.minNextOffset(ctx, streamID)
	if err != nil {
		return 0, fmt.Errorf("trim %s: consumers: %w", streamID, err)
	}
	if ok && read >= 0 {
		end = min(end, uint64(read))
	}
	end = min(end, first+uint64(limit))
	if end <= first {
		return 0, nil
	}
	req, _ := json.Marshal(map[string]uint64{"seq": end})
	msg, err := b.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+st.name, req)
	if err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	var resp struct {
		Success bool                `json:"success"`
		Purged  uint64              `json:"purged"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("trim %s: %w", streamID, resp.Error)
	}
	return int(resp.Purged), nil
}

// ReadFrom implements stream.Scanner on an ordered consumer of its own,
// stopped before it returns: an ephemeral JetStream consumer that no
// consumer list shows and that holds nothing back.
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
	s, err := b.state(ctx, st)
	if err != nil {
		return nil, err
	}
	start := max(uint64(from), firstSeq(s))
	if start > s.LastSeq {
		return []stream.StoredEvent{}, nil
	}
	r := &reader{}
	defer r.stop()
	return b.readFrom(ctx, r, st, start, s.LastSeq, limit)
}
