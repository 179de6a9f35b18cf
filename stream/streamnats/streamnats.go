// Package streamnats is the NATS JetStream stream backend: each postbox
// stream is one JetStream stream, each event one message, and an event's
// offset is its JetStream stream sequence.
//
// # Streams and offsets
//
// The stream of source id S is the JetStream stream Prefix+encode(S)
// (letters, digits and '-' as they are, every other byte as _XX; a long id
// is cut and ends in a hash), with File storage, Config.Replicas replicas
// and S itself in its Description, from which Streams reads it back. The
// stream id is the source id. Offsets are JetStream's sequences: they
// start at 1, grow by one with each stored message and are never reused,
// not even after a purge, which keeps the sequence.
//
// # Stored once, forever
//
// JetStream's own deduplication (Nats-Msg-Id) lasts the stream's
// duplicate window only, two minutes by default, and holds every id of the
// window in memory; a redelivery after it would be stored twice. postbox
// does not use it. Instead each event is published on a subject of its
// own identity,
//
//	<stream name>.<32 hex digits of sha256(len(variant), variant, native id)>
//
// with the header Nats-Expected-Last-Subject-Sequence: 0, so JetStream
// stores it only if that subject holds no message yet; the check is made
// by the stream's leader, in order with every other publish, so two
// concurrent publishers of one identity cannot both store it. A refused
// publish makes Append fetch the stored message (last message on the
// subject) and compare type and payload byte for byte: the same is a
// Duplicate with the original offset and time, anything else a
// *stream.ConflictError. This holds for as long as the event is in the
// stream, whatever the duplicate window (Config.DuplicateWindow only sets
// the stream's window for other publishers). Lookup is the same "last
// message on the subject" get. The cost is JetStream's per-subject index:
// every stored event keeps a subject entry (a few dozen bytes) in the
// server's memory until it is trimmed. An event deleted by Trim is
// forgotten, as on SQLite: a redelivery after that is stored again.
//
// The other choices were a KV index of identities (a second write per
// event, and no atomicity between index and stream) and one subject per
// identity with max_msgs_per_subject 1 and discard_new_per_subject, which
// has the same memory cost but refuses with an error code that is also
// used for real store failures.
//
// # Messages
//
// A message's data is the event's payload, byte for byte, so that
// `nats stream get` shows it as it came. The rest of the event is one
// header, Postbox-Event (HeaderEvent), a line of key=value fields
// separated by ';' and escaped so that any string survives NATS's header
// framing:
//
//	Postbox-Event: at=2026-11-24T08:10:49.123456789Z;id=ord-1;type=order.created;occurred=2026-11-24T08:10:48.000000000Z;meta={"device_id":"dev-17"}
//
// One header rather than one per field: every header costs the server
// when it stores and delivers a message and the client when it builds and
// parses one, so reads and appends are faster, and the line still reads
// well in `nats stream get`. Times are UTC with nine fractional digits, a
// fixed width that parses without time.Parse. The first field, at, is
// StoredAt, stamped by the Backend when it publishes: a publish ack does
// not carry JetStream's own timestamp, and Append must report the StoredAt
// that reads give back. Being first, it is read without decoding the rest.
// The Backend publishes under one lock, with stamps that never go back, so
// along the offsets of one Backend stored times never decrease, and
// stream.StartAtTime (and Trim's "before t") is a binary search over
// sequences by that field. It is within a millisecond of JetStream's
// time on one host; with several postbox processes appending to one
// stream, by as much as their clocks differ.
//
// # What an ack promises
//
// Append returns once JetStream acknowledged every event. A publish ack
// means the stream's leader (and with Replicas 3, a quorum of the
// replicas) holds the message in its file store; it does not mean it is on
// disk. nats-server fsyncs file storage every sync_interval, 2 minutes by
// default, so a power loss (not a process crash) of the servers holding
// it can lose acknowledged events. Run nats-server with
//
//	jetstream { sync_interval: always }
//
// for the promise that SQLite's synchronous=FULL gives: every
// acknowledged event is on disk. With R3 the default interval loses
// acknowledged events only if a quorum of replicas loses power at once.
//
// # Appending
//
// Append publishes every event of a call asynchronously on one JetStream
// context, then waits for all the acks: a call of many events costs one
// round trip, not one per event. An event refused as an identity already
// stored costs one more request.
//
// # Consumers
//
// Consumer positions live in a JetStream KV bucket, Prefix+"consumers",
// one key per consumer (its id encoded as stream names are), holding JSON
// ({stream, next_offset, start, created_at, updated_at}). Commit and Reset
// are compare-and-set on the key's revision, so concurrent callers never
// lose an update. The bucket does not allow direct gets, so every read is
// answered by its leader and sees the last write. A consumer's lag is
// computed from its position and the stream's last sequence; JetStream's
// own consumer list does not show postbox consumers (postbox's metrics
// do).
//
// Read serves sequential reads from a JetStream ordered consumer kept per
// postbox consumer: a Read that continues where the previous one ended
// takes messages the ordered consumer has already prefetched, and one that
// starts elsewhere makes a new one.
package streamnats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/stream"
)

var (
	_ stream.Backend = (*Backend)(nil)
	_ stream.Waiter  = (*Backend)(nil)
	_ stream.Trimmer = (*Backend)(nil)
	_ stream.Scanner = (*Backend)(nil)
)

// BackendName is what Stream.Backend says.
const BackendName = "nats"

// Defaults of Config.
const (
	DefaultPrefix          = "POSTBOX_"
	DefaultReplicas        = 1
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultAckTimeout      = 30 * time.Second
	DefaultMaxPending      = 16384
)

// Config configures a Backend. Zero fields take their defaults.
type Config struct {
	// URL is the server list, "nats://host:4222[,nats://host2:4222...]",
	// used when Conn is nil. Credentials and TLS go in the fields below
	// (ParseURL fills them from a URL's query).
	URL string
	// Conn is a connection to use instead of dialling URL. The Backend
	// does not close it.
	Conn *nats.Conn
	// Options are added to the connection's options when dialling URL.
	Options []nats.Option

	// Prefix begins the name of every JetStream stream and bucket the
	// Backend makes, so that several postbox installations (or tests) can
	// share one NATS. Letters, digits, '_' and '-'; no installation's
	// prefix should begin with another's. Defaults to DefaultPrefix.
	Prefix string
	// Replicas of every stream and of the consumer bucket: 1 or 3.
	// Defaults to DefaultReplicas. It applies to what the Backend creates;
	// existing streams keep theirs.
	Replicas int
	// DuplicateWindow is the Duplicates window of the streams the Backend
	// creates. postbox does not rely on it (see the package doc). Defaults
	// to DefaultDuplicateWindow, JetStream's own.
	DuplicateWindow time.Duration
	// AckTimeout bounds the wait for a publish ack. Defaults to
	// DefaultAckTimeout.
	AckTimeout time.Duration
	// MaxPending bounds the publishes waiting for their acks, across all
	// callers. Defaults to DefaultMaxPending.
	MaxPending int
}

// Backend stores streams in NATS JetStream. Open one with Open; it is safe
// for concurrent use.
type Backend struct {
	cfg    Config
	nc     *nats.Conn
	ownsNC bool
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	kvs    jetstream.Stream // kv's stream, whose subjects list the consumers

	pubMu    sync.Mutex // publishes in stamp order
	lastTime time.Time

	mu      sync.Mutex
	streams map[string]*streamState
	creates map[string]*creation

	readersMu sync.Mutex
	readers   map[string]*reader

	closed atomic.Bool
}

// streamState is what the Backend keeps of one stream.
type streamState struct {
	stream.Stream
	name    string // JetStream's name, also the first subject token
	subject string // name + ".*": every event of the stream
	js      jetstream.Stream

	last atomic.Uint64 // the highest sequence this Backend saw
	mu   sync.Mutex
	grew chan struct{} // closed when last grows
}

// creation is an EnsureStream in progress, which concurrent callers wait
// for.
type creation struct {
	done chan struct{}
	st   *streamState
	err  error
}

// Open connects (unless cfg.Conn is set), makes sure the consumer bucket
// exists and returns the Backend.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	for _, c := range cfg.Prefix {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return nil, fmt.Errorf("streamnats: prefix %q: only letters, digits, '_' and '-'", cfg.Prefix)
		}
	}
	switch cfg.Replicas {
	case 0:
		cfg.Replicas = DefaultReplicas
	case 1, 3:
	default:
		return nil, fmt.Errorf("streamnats: replicas %d: want 1 or 3", cfg.Replicas)
	}
	if cfg.DuplicateWindow < 0 || cfg.AckTimeout < 0 || cfg.MaxPending < 0 {
		return nil, errors.New("streamnats: DuplicateWindow, AckTimeout and MaxPending must not be negative")
	}
	if cfg.DuplicateWindow == 0 {
		cfg.DuplicateWindow = DefaultDuplicateWindow
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	b := &Backend{cfg: cfg, nc: cfg.Conn, streams: map[string]*streamState{}, creates: map[string]*creation{}, readers: map[string]*reader{}}
	if b.nc == nil {
		if cfg.URL == "" {
			return nil, errors.New("streamnats: Config needs a URL or a Conn")
		}
		opts := append([]nats.Option{nats.Name("postbox"), nats.MaxReconnects(-1)}, cfg.Options...)
		nc, err := nats.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("streamnats: connect to %s: %w", redact(cfg.URL), err)
		}
		b.nc, b.ownsNC = nc, true
	}
	js, err := jetstream.New(b.nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending), jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("streamnats: %w", err)
	}
	b.js = js
	if err := b.openConsumers(ctx); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Conn returns the Backend's NATS connection.
func (b *Backend) Conn() *nats.Conn { return b.nc }

// Close stops the Backend's readers and closes its connection if Open
// dialled it. Close waits for nothing the Backend published: calls in
// progress return with an error.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.readersMu.Lock()
	for id, r := range b.readers {
		r.stop()
		delete(b.readers, id)
	}
	b.readersMu.Unlock()
	if b.ownsNC && b.nc != nil {
		b.nc.Close()
	}
	return nil
}

// StreamName returns the JetStream stream name of sourceID under prefix.
func StreamName(prefix, sourceID string) string { return prefix + encodeName(sourceID) }

// description is what a stream's Description holds.
type description struct {
	Source string `json:"postbox_source"`
	Prefix string `json:"postbox_prefix"`
}

// EnsureStream implements stream.Backend. Concurrent callers for one
// source share one creation.
func (b *Backend) EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error) {
	if sourceID == "" {
		return stream.Stream{}, errors.New("ensure stream: empty source id")
	}
	b.mu.Lock()
	if st, ok := b.streams[sourceID]; ok {
		b.mu.Unlock()
		return st.Stream, nil
	}
	c, ok := b.creates[sourceID]
	if !ok {
		c = &creation{done: make(chan struct{})}
		b.creates[sourceID] = c
		b.mu.Unlock()
		c.st, c.err = b.createStream(ctx, sourceID)
		b.mu.Lock()
		if c.err == nil {
			b.streams[sourceID] = c.st
		}
		delete(b.creates, sourceID)
		close(c.done)
	}
	b.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		return stream.Stream{}, ctx.Err()
	}
	if c.err != nil {
		return stream.Stream{}, c.err
	}
	return c.st.Stream, nil
}

func (b *Backend) createStream(ctx context.Context, sourceID string) (*streamState, error) {
	name := StreamName(b.cfg.Prefix, sourceID)
	desc, _ := json.Marshal(description{Source: sourceID, Prefix: b.cfg.Prefix})
	cfg := jetstream.StreamConfig{
		Name:              name,
		Description:       string(desc),
		Subjects:          []string{name + ".*"},
		Storage:           jetstream.FileStorage,
		Replicas:          b.cfg.Replicas,
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		Duplicates:        b.cfg.DuplicateWindow,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: -1,
		MaxMsgSize:        -1,
	}
	s, err := b.js.CreateStream(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = b.js.Stream(ctx, name) // made with other settings: used as it is
	}
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", sourceID, mapErr(err))
	}
	if err := b.probe(ctx, name); err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	return b.newStreamState(sourceID, s)
}

// probe returns once a publish to stream name from this connection
// reaches the stream. In a cluster the stream's leader announces its
// subjects over routes a moment after the stream is created; a publish
// before that finds nobody, and the client's retry of it would store it
// after the events published behind it. The probe names another stream
// in Nats-Expected-Stream, so the stream refuses it and stores nothing.
func (b *Backend) probe(ctx context.Context, name string) error {
	m := &nats.Msg{Subject: name + ".probe", Header: nats.Header{"Nats-Expected-Stream": []string{"postbox-probe"}}}
	for {
		_, err := b.nc.RequestMsgWithContext(ctx, m)
		if !errors.Is(err, nats.ErrNoResponders) {
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for the stream to answer: %w", ctx.Err())
			}
			return nil // the stream's refusal, or a timeout that the first Append will meet too
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the stream to answer: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (b *Backend) newStreamState(sourceID string, s jetstream.Stream) (*streamState, error) {
	info := s.CachedInfo()
	var d description
	if json.Unmarshal([]byte(info.Config.Description), &d) != nil || d.Source != sourceID {
		return nil, fmt.Errorf("stream %s: JetStream stream %s belongs to no postbox source %q (description %q)", sourceID, info.Config.Name, sourceID, info.Config.Description)
	}
	st := &streamState{
		Stream:  stream.Stream{ID: sourceID, SourceID: sourceID, Backend: BackendName, CreatedAt: info.Created.UTC()},
		name:    info.Config.Name,
		subject: info.Config.Name + ".*",
		js:      s,
		grew:    make(chan struct{}),
	}
	st.last.Store(info.State.LastSeq)
	return st, nil
}

// stream returns the state of streamID, from memory or from JetStream
// (another process may have created it).
func (b *Backend) stream(ctx context.Context, id string) (*streamState, error) {
	b.mu.Lock()
	st, ok := b.streams[id]
	b.mu.Unlock()
	if ok {
		return st, nil
	}
	if id == "" {
		return nil, fmt.Errorf("%w: empty id", stream.ErrStreamNotFound)
	}
	s, err := b.js.Stream(ctx, StreamName(b.cfg.Prefix, id))
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", id, mapErr(err))
	}
	if st, err = b.newStreamState(id, s); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.streams[id]; ok {
		return old, nil
	}
	b.streams[id] = st
	return st, nil
}

// Streams implements stream.Backend: every JetStream stream whose name
// begins with Prefix and whose description names a postbox source under
// this prefix.
func (b *Backend) Streams(ctx context.Context) ([]stream.Stream, error) {
	var out []stream.Stream
	l := b.js.ListStreams(ctx)
	for info := range l.Info() {
		if !strings.HasPrefix(info.Config.Name, b.cfg.Prefix) {
			continue
		}
		var d description
		if json.Unmarshal([]byte(info.Config.Description), &d) != nil || d.Source == "" || d.Prefix != b.cfg.Prefix {
			continue
		}
		out = append(out, stream.Stream{ID: d.Source, SourceID: d.Source, Backend: BackendName, CreatedAt: info.Created.UTC()})
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", mapErr(err))
	}
	slices.SortFunc(out, func(x, y stream.Stream) int { return strings.Compare(x.ID, y.ID) })
	return out, nil
}

// Append implements stream.Backend.
func (b *Backend) Append(ctx context.Context, streamID string, events []stream.Event) ([]stream.AppendResult, error) {
	st, err := b.stream(ctx, streamID)
	if err != nil {
		return nil, err
	}
	results := make([]stream.AppendResult, len(events))
	if len(events) == 0 {
		return results, nil
	}
	futures := make([]jetstream.PubAckFuture, len(events))
	subjects := make([]string, len(events))
	prefix := st.name + "."
	for i := range events {
		subjects[i] = identitySubject(prefix, events[i].NativeID, events[i].Variant)
	}

	b.pubMu.Lock()
	now := time.Now().UTC()
	if now.Before(b.lastTime) {
		now = b.lastTime // the clock went back: stored times still never decrease
	}
	b.lastTime = now
	stamp := string(appendTime(nil, now))
	var pubErr error
	sent := 0
	for i := range events {
		f, err := b.publish(ctx, message(subjects[i], &events[i], stamp))
		if errors.Is(err, nats.ErrMaxPayload) { // this event alone: the rest of the call goes on
			results[i].Err = fmt.Errorf("%w: %d payload bytes and its headers are over the NATS server's max_payload of %d bytes",
				stream.ErrTooLarge, len(events[i].Payload), b.nc.MaxPayload())
			sent++
			continue
		}
		if err != nil {
			pubErr = fmt.Errorf("append to %s: publish: %w", streamID, mapErr(err))
			break
		}
		futures[i] = f
		sent++
	}
	b.pubMu.Unlock()

	var refused []int // events whose identity the stream already held
	var ackErr error
	var top uint64
wait:
	for i, f := range futures[:sent] {
		if f == nil { // refused before it was sent
			continue
		}
		select {
		case ack := <-f.Ok():
			results[i].Offset, results[i].StoredAt = int64(ack.Sequence), now
			top = max(top, ack.Sequence)
		case err := <-f.Err():
			if isWrongLastSeq(err) {
				refused = append(refused, i)
			} else if ackErr == nil {
				ackErr = fmt.Errorf("append to %s: %w", streamID, mapErr(err))
			}
		case <-ctx.Done():
			ackErr = fmt.Errorf("append to %s: waiting for acks: %w", streamID, ctx.Err())
			break wait
		}
	}
	if top > 0 {
		st.grow(top)
	}
	if err := errors.Join(pubErr, ackErr); err != nil {
		return nil, err
	}
	for _, i := range refused {
		if err := b.resolve(ctx, st, subjects[i], &events[i], &results[i]); err != nil {
			return nil, fmt.Errorf("append to %s: %w", streamID, err)
		}
	}
	return results, nil
}

// publish publishes m asynchronously, waiting (while ctx lasts) when
// MaxPending acks are outstanding.
func (b *Backend) publish(ctx context.Context, m *nats.Msg) (jetstream.PubAckFuture, error) {
	for {
		f, err := b.js.PublishMsgAsync(m)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// resolve reports an event whose identity subject already holds a
// message: a Duplicate of it, or a conflict.
//
// The message that holds the subject may not be readable yet: another
// process published it a moment ago, and the server that answers (a
// replica, with direct gets) has not applied it. resolve looks again for
// up to resolveWait before it calls the look-up failed.
func (b *Backend) resolve(ctx context.Context, st *streamState, subject string, ev *stream.Event, r *stream.AppendResult) error {
	m, err := st.js.GetLastMsgForSubject(ctx, subject)
	for wait, waited := 10*time.Millisecond, time.Duration(0); errors.Is(err, jetstream.ErrMsgNotFound) && waited < resolveWait; wait *= 2 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		waited += wait
		m, err = st.js.GetLastMsgForSubject(ctx, subject)
	}
	if err != nil {
		return fmt.Errorf("look up %s refused as stored: %w", ev.NativeID, mapErr(err))
	}
	var stored stream.StoredEvent
	if err := decode(&stored, m.Header, m.Data, nil); err != nil {
		return fmt.Errorf("message %d of %s: %w", m.Sequence, st.name, err)
	}
	if stored.NativeID != ev.NativeID || stored.Variant != ev.Variant {
		return fmt.Errorf("identity hash collision: %s/%s and the stored %s/%s share subject %s", ev.NativeID, ev.Variant, stored.NativeID, stored.Variant, subject)
	}
	r.Offset = int64(m.Sequence)
	if r.Err = stream.Conflict(&stored.Event, ev); r.Err == nil {
		r.Duplicate = true
		r.StoredAt = storedAt(m.Header, m.Time)
	}
	return nil
}

// resolveWait bounds how long resolve waits for a refused event's stored
// copy to become readable.
const resolveWait = 2 * time.Second

// grow records that st holds sequence seq and wakes its waiters.
func (st *streamState) grow(seq uint64) {
	for {
		cur := st.last.Load()
		if seq <= cur {
			return
		}
		if st.last.CompareAndSwap(cur, seq) {
			break
		}
	}
	st.mu.Lock()
	close(st.grew)
	st.grew = make(chan struct{})
	st.mu.Unlock()
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// mapErr translates JetStream's errors into stream's sentinels where they
// mean the same, keeping the original in the chain.
func mapErr(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w (%v)", stream.ErrStreamNotFound, err)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%w (%v)", stream.ErrNotFound, err)
	}
	return err
}
