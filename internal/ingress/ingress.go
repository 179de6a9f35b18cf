// Package ingress is the accept path of postbox serve: it reads envelopes
// from a transport, validates them, queues them for the store's single
// writer and answers each with exactly one ACK or NACK, an ACK only after
// the event's transaction committed. One file per transport.
package ingress

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/logsample"
	"github.com/postbox-events/postbox/internal/schedule"
	"github.com/postbox-events/postbox/internal/tracing"
	"github.com/postbox-events/postbox/internal/wsping"
	"github.com/postbox-events/postbox/stream"
)

// Appender is the store the ingress writes to (streamsqlite.Backend).
type Appender interface {
	// AppendAsync queues events and calls done after their commit. It
	// blocks while the store's queue is full.
	AppendAsync(ctx context.Context, streamID string, events []stream.Event, done func([]stream.AppendResult, error)) error
}

// queue is an Appender that tells how full its queue is (streamsqlite.Backend,
// appendq.Queue): a connection that waits for room in it is counted
// (postbox_ingress_saturated).
type queue interface {
	QueueLen() int
	QueueCap() int
}

// full reports whether store's queue has no room for n events, as its
// writer judges room: an empty queue takes any number.
func full(store Appender, n int) bool {
	q, ok := store.(queue)
	if !ok {
		return false
	}
	l := q.QueueLen()
	return l > 0 && l+n > q.QueueCap()
}

// Tokens maps the sha256 of a bearer token to the device id it may send for.
type Tokens map[[32]byte]string

// Device returns the device a bearer token belongs to.
func (t Tokens) Device(token string) (string, bool) {
	d, ok := t[sha256.Sum256([]byte(token))]
	return d, ok
}

// Add lets token send for deviceID.
func (t Tokens) Add(token, deviceID string) { t[sha256.Sum256([]byte(token))] = deviceID }

// Defaults of Config.
const (
	DefaultMaxFrameBytes = 16 << 20
	DefaultMaxInFlight   = 8192
	// DefaultMaxConnections leaves room under the server's cap on TCP
	// connections for the HTTP API and webhooks.
	DefaultMaxConnections = 5000
	// DefaultMaxConnectionsPerAddress lets one address hold as many
	// connections as a busy gateway needs, and no client all of them.
	DefaultMaxConnectionsPerAddress = 64
	// DefaultMaxBufferedBytes is MaxBufferedBytes's default: eight frames
	// of the default size.
	DefaultMaxBufferedBytes = 8 * DefaultMaxFrameBytes
	// DefaultFrameTimeout is FrameTimeout's default: a 16 MiB frame
	// arrives within it at about 2.3 Mbit/s.
	DefaultFrameTimeout = time.Minute
)

// Config configures the ingress. Zero fields take their defaults.
type Config struct {
	// StreamID is the stream device events are appended to.
	StreamID string
	// Limits bound each envelope.
	Limits postbox.Limits
	// Tokens, when not nil, makes every connection authenticate with a
	// bearer token, and lets it send only for the token's device.
	Tokens Tokens
	// MaxFrameBytes bounds one transport frame. Defaults to 16 MiB, and is
	// at least twice Limits.MaxEnvelopeBytes.
	MaxFrameBytes int64
	// MaxInFlight bounds the envelopes one connection has sent and not yet
	// been answered for; the connection is not read while it is reached.
	// Defaults to 8192.
	MaxInFlight int
	// MaxConnections bounds the open connections, WebSockets and gRPC
	// streams together; one more is refused (before the WebSocket upgrade
	// with 503 and Retry-After, a gRPC stream with ResourceExhausted),
	// except a device's new connection that replaces its old one. Defaults to
	// DefaultMaxConnections; negative means no bound.
	MaxConnections int
	// MaxConnectionsPerAddress bounds the open connections without a
	// device token (without Tokens, every connection) from one client
	// address: an IPv4 address, or an IPv6 /64. One more is refused as one
	// over MaxConnections is. A connection with a token is not counted: its
	// device holds one connection at a time (a new one replaces the old),
	// and many devices may share an address behind NAT. Behind a proxy
	// every connection comes from the proxy's address: raise the bound or
	// turn it off. Defaults to DefaultMaxConnectionsPerAddress; negative
	// means no bound.
	MaxConnectionsPerAddress int
	// MaxBufferedBytes bounds the memory of frames read and not yet
	// stored, over all connections: a frame being read or decoded counts
	// by the bytes of it that arrived (its buffer, which grows as they
	// arrive: at most half again, or 64 KiB, more), its decoded envelopes
	// by their size until their commit (in the writer's queue, and in the
	// batch being written, they count here as well as against the store's
	// queue bytes). A connection
	// holds at most MaxFrameBytes of decoded envelopes besides the frame it
	// reads. A connection that finds no room is not read until there is.
	// The last MaxFrameBytes (at most half) are a reserve one frame at a
	// time may use once the rest is taken, so frames that each hold part
	// of themselves do not wait on each other forever. Defaults to
	// DefaultMaxBufferedBytes, and is at least MaxFrameBytes.
	MaxBufferedBytes int64
	// FrameTimeout bounds how long a frame's body may take to arrive once
	// its header has, waits for room in MaxBufferedBytes included; the
	// connection is then closed and its buffer freed. Waiting for the next
	// frame is not bounded (pings find dead peers). Defaults to
	// DefaultFrameTimeout.
	FrameTimeout time.Duration
	// PingInterval is how often an idle or busy connection's peer is
	// pinged; a peer that does not answer within PingTimeout is dropped.
	// A ping is not held against a peer while its connection is not read
	// because of this side (memory bounds, a full writer queue).
	// Defaults to 20s and 10s; a negative interval turns pings off.
	PingInterval time.Duration
	PingTimeout  time.Duration
	// SourceGone, when not nil, is asked before each frame is stored: an
	// error means the stream's source takes no events (it was deleted),
	// and every valid envelope of the frame is NACKed as unavailable with
	// the error's message, so that a sender keeps it and sends it again;
	// nothing is stored. It runs on every connection's read path, so it
	// must be cheap (cache what it reads).
	SourceGone func() error
	// Source, when not nil, lets a connection send to a device source
	// other than the default one (StreamID, checked by SourceGone): a
	// WebSocket names it in its URL (?source=NAME), a gRPC stream in its
	// metadata (SourceMetadata). Source returns the source's stream and
	// the check its frames take as SourceGone (nil: none), or an error:
	// one that wraps ErrNoSource refuses the connection as not found
	// (404 not_found, gRPC NotFound), any other as unavailable. Without
	// Source, a connection that names a source other than the default
	// is refused as not found.
	Source func(ctx context.Context, name string) (stream string, gone func() error, err error)
	// TokenRate, when not zero (and with Tokens), bounds the events each
	// device token sends, in RateLimiter's bucket "device:ID". A
	// connection over it is not read further until the bucket refills
	// (its events wait before they are queued for the writer, which
	// holds up reading as a full queue does): backpressure, counted in
	// postbox_ingress_rate_limited_total{limit="token"} and
	// postbox_ingress_rate_limited_seconds_total.
	TokenRate   intakerate.Rate
	RateLimiter *intakerate.Limiter
	Logger      *slog.Logger
	Metrics     *Metrics
}

// ErrNoSource is what Config.Source wraps when a connection names a
// source that is not a device source.
var ErrNoSource = errors.New("no such device source")

// SourceMetadata is the gRPC metadata key that names a stream's source,
// as ?source=NAME does a WebSocket's.
const SourceMetadata = "postbox-source"

// target returns the stream a connection naming source sends to and the
// check of its frames: the default's when source is empty or the
// default (StreamID).
func (in *Ingress) target(ctx context.Context, source string) (string, func() error, error) {
	if source == "" || source == in.cfg.StreamID {
		return in.cfg.StreamID, in.cfg.SourceGone, nil
	}
	if in.cfg.Source == nil {
		return "", nil, fmt.Errorf("source %q: %w: this server takes device events only for %s", source, ErrNoSource, in.cfg.StreamID)
	}
	return in.cfg.Source(ctx, source)
}

// Ingress accepts envelopes for the stream of each connection's source.
type Ingress struct {
	store  Appender
	cfg    Config
	log    *slog.Logger
	m      *Metrics
	sample *logsample.Sampler // the INFO lines of each event: at most 10 a second of each message

	sessions  sync.WaitGroup
	drain     chan struct{} // closed by Drain
	drainOnce sync.Once

	budget *budget // MaxBufferedBytes

	mu      sync.Mutex
	open    int                 // connections admitted
	byAddr  map[string]int      // connections admitted without a token, by clientAddr
	devices map[string]*session // the connection of each token's device

	// Test hooks (nil outside white-box tests): afterRead runs when a
	// frame was read and counted, before it is decoded; drainWaits when a
	// draining connection waits for its answers.
	afterRead  func()
	drainWaits func()
}

// Drain stops reading new frames on every connection, lets each answer
// the envelopes it already read, and closes it as "going away". It returns
// when all connections are closed, or with ctx's error when ctx ends first
// (the caller then cancels the connections' context). New connections
// after Drain are closed at once.
func (in *Ingress) Drain(ctx context.Context) error {
	in.drainOnce.Do(func() {
		in.mu.Lock() // no session is added once Wait may run (see enterSession)
		close(in.drain)
		in.mu.Unlock()
	})
	done := make(chan struct{})
	go func() { in.sessions.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enterSession counts a new connection's session for Drain to wait for,
// unless Drain has begun: a WaitGroup must not grow from zero while it is
// waited for. It reports whether the session may run.
func (in *Ingress) enterSession() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	select {
	case <-in.drain:
		return false
	default:
	}
	in.sessions.Add(1)
	return true
}

// New returns an ingress appending to store.
func New(store Appender, cfg Config) (*Ingress, error) {
	if cfg.StreamID == "" {
		return nil, errors.New("ingress: StreamID is required")
	}
	if cfg.MaxFrameBytes <= 0 {
		cfg.MaxFrameBytes = DefaultMaxFrameBytes
	}
	// A frame always has room for one envelope of the largest size allowed,
	// so that an oversized envelope earns a NACK instead of a closed
	// connection.
	cfg.MaxFrameBytes = max(cfg.MaxFrameBytes, 2*int64(cfg.Limits.MaxEnvelopeBytes))
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.MaxConnectionsPerAddress == 0 {
		cfg.MaxConnectionsPerAddress = DefaultMaxConnectionsPerAddress
	}
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	cfg.MaxBufferedBytes = max(cfg.MaxBufferedBytes, cfg.MaxFrameBytes)
	if cfg.FrameTimeout <= 0 {
		cfg.FrameTimeout = DefaultFrameTimeout
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = wsping.DefaultInterval
	}
	if cfg.PingTimeout <= 0 {
		cfg.PingTimeout = wsping.DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.RateLimiter == nil {
		cfg.RateLimiter = intakerate.NewMemory()
	}
	return &Ingress{store: store, cfg: cfg, log: cfg.Logger, m: cfg.Metrics, sample: logsample.New(0), drain: make(chan struct{}),
		budget: newBudget(cfg.MaxBufferedBytes, cfg.MaxFrameBytes, cfg.Metrics.buffered), devices: map[string]*session{}, byAddr: map[string]int{}}, nil
}

// decoded is one frame turned into events to append and replies to send at
// once (refusals).
type decoded struct {
	ids     []string
	events  []stream.Event
	spans   []trace.Span // the events' intake spans; nil while tracing is off
	refused []postbox.Reply
}

// maxEchoedID bounds the event_id a NACK names back: a longer one (over
// any id limit) is not copied into the reply, so that the refusals queued
// for a peer that does not read them stay small: a frame of 16 MiB ids
// once held the server's memory at a gigabyte.
const maxEchoedID = 1024

// decodeFrame validates every envelope of a frame. device, when not empty,
// is the only device_id the sender may use.
func (in *Ingress) decodeFrame(frame []byte, device, streamID string) decoded {
	var d decoded
	raws, err := postbox.SplitFrame(frame)
	if err == nil && len(raws) == 0 {
		err = &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "frame is an empty array: it holds no envelope"}
	}
	if err != nil {
		d.refused = append(d.refused, postbox.Nack("", err))
		return d
	}
	d.ids = make([]string, 0, len(raws))
	d.events = make([]stream.Event, 0, len(raws))
	traced := tracing.Enabled()
	for _, raw := range raws {
		env, err := postbox.DecodeEnvelope(raw, in.cfg.Limits)
		if err == nil && device != "" && env.DeviceID != device {
			err = &postbox.FieldError{Field: "device_id", Code: postbox.CodeForbidden,
				Message: fmt.Sprintf("device_id: this token may send only for %q, not %q", device, env.DeviceID)}
		}
		if err != nil {
			id := env.EventID
			if id == "" {
				id = postbox.PeekEventID(raw)
			}
			if len(id) > maxEchoedID {
				id = ""
			}
			d.refused = append(d.refused, postbox.Nack(id, err))
			continue
		}
		if traced {
			d.spans = append(d.spans, startIntake(&env, streamID))
		}
		d.ids = append(d.ids, env.EventID)
		d.events = append(d.events, toEvent(&env))
	}
	return d
}

// toEvent turns a valid envelope into the stream event stored for it. An
// event's identity is (device_id, event_id): the device is the event's
// variant, so that two devices' events with one event_id are both stored.
// The payload is stored compacted, so that a redelivery that differs only
// in insignificant whitespace is a duplicate, not a conflict. The trace
// context, when the envelope has one, is kept in the metadata
// (traceparent, tracestate), and so is its delivery time (deliver_at, in
// UTC), which delivery makes its items due at.
func toEvent(env *postbox.Envelope) stream.Event {
	meta := make([]byte, 0, 64+len(env.DeviceID)+len(env.SessionID)+len(env.TraceParent)+len(env.TraceState))
	meta = append(meta, `{"device_id":`...)
	meta = appendString(meta, env.DeviceID)
	meta = append(meta, `,"session_id":`...)
	meta = appendString(meta, env.SessionID)
	meta = append(meta, `,"schema_version":`...)
	meta = strconv.AppendInt(meta, int64(env.SchemaVersion), 10)
	if env.TraceParent != "" { // validated: plain ASCII
		meta = append(meta, `,"traceparent":`...)
		meta = appendString(meta, env.TraceParent)
		if env.TraceState != "" {
			meta = append(meta, `,"tracestate":`...)
			meta = appendString(meta, env.TraceState)
		}
	}
	if env.DeliverAt != "" { // validated: an RFC 3339 time
		if at, err := time.Parse(time.RFC3339Nano, env.DeliverAt); err == nil {
			meta = append(meta, `,"`+schedule.Key+`":`...)
			meta = appendString(meta, schedule.Format(at))
		}
	}
	meta = append(meta, '}')
	return stream.Event{
		NativeID:   env.EventID,
		Variant:    env.DeviceID,
		Type:       env.Type,
		OccurredAt: env.Time(),
		Sequence:   env.Seq,
		Metadata:   meta,
		Payload:    postbox.AppendCompact(make([]byte, 0, len(env.Payload)), env.Payload), // a copy: the frame is not pinned until commit
	}
}

// conflictNack is the NACK of an event whose identity is stored with
// another type or payload: it names the field that differs.
func conflictNack(id string, err error) postbox.Reply {
	field := stream.FieldPayload
	var ce *stream.ConflictError
	if errors.As(err, &ce) {
		field = ce.Field
	}
	return postbox.Nack(id, &postbox.FieldError{Field: field, Code: postbox.CodeConflict,
		Message: field + ": differs from the stored event with this device_id and event_id; nothing was changed"})
}

// appendString appends s as a JSON string. s is a validated envelope id:
// valid UTF-8 without control characters, so only quotes and backslashes
// need escaping.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// appendReplies appends the ACKs and NACKs of append results to out,
// counting them for streamID.
func (in *Ingress) appendReplies(out []postbox.Reply, streamID string, events []stream.Event, ids []string, results []stream.AppendResult, err error) []postbox.Reply {
	var last postbox.Reply // events of one commit share a time: format it once
	logs := err == nil && in.log.Enabled(context.Background(), slog.LevelInfo)
	for i, id := range ids {
		switch {
		case err != nil:
			out = append(out, postbox.Nack(id, &postbox.FieldError{Code: postbox.CodeOutage, Message: "not stored, send again: " + err.Error()}))
			in.m.events.WithLabelValues(streamID, "unavailable").Inc()
		case errors.Is(results[i].Err, stream.ErrConflict):
			out = append(out, conflictNack(id, results[i].Err))
			in.m.events.WithLabelValues(streamID, "conflict").Inc()
			in.logEvent(slog.LevelWarn, "ingress: event refused: stored before with another type or payload", streamID, &events[i], results[i])
		case results[i].Err != nil: // stream.ErrTooLarge: the backend cannot store it, ever
			out = append(out, postbox.Nack(id, &postbox.FieldError{Code: postbox.CodeTooLarge, Message: results[i].Err.Error()}))
			in.m.events.WithLabelValues(streamID, "rejected").Inc()
		case results[i].Duplicate || last.AckTS == "" || !results[i].StoredAt.Equal(results[i-1].StoredAt):
			last = postbox.Ack(id, results[i].StoredAt, results[i].Duplicate)
			out = append(out, last)
		default:
			out = append(out, postbox.Reply{EventID: id, Status: postbox.StatusStored, AckTS: last.AckTS})
		}
		if logs && results[i].Err == nil {
			if results[i].Duplicate {
				in.logEvent(slog.LevelInfo, "ingress: duplicate event ACKed, stored before", streamID, &events[i], results[i])
			} else {
				in.logEvent(slog.LevelInfo, "ingress: event stored", streamID, &events[i], results[i])
			}
		}
	}
	if err == nil {
		in.countStored(streamID, results)
	}
	return out
}

// logEvent logs msg with the identity of ev, stored at res: its source
// (the stream), device, event id and offset; at most 10 lines of msg a
// second, the next saying how many were left out.
func (in *Ingress) logEvent(level slog.Level, msg, streamID string, ev *stream.Event, res stream.AppendResult) {
	ok, skipped := in.sample.Allow(msg)
	if !ok {
		return
	}
	attrs := []slog.Attr{slog.String("source", streamID), slog.String("device", ev.Variant),
		slog.String("event_id", ev.NativeID), slog.String("type", ev.Type)}
	if res.Err == nil {
		attrs = append(attrs, slog.Int64("offset", res.Offset))
	}
	if skipped > 0 {
		attrs = append(attrs, slog.Int("skipped", skipped))
	}
	in.log.LogAttrs(context.Background(), level, msg, attrs...)
}

func (in *Ingress) countStored(streamID string, results []stream.AppendResult) {
	var stored, dup float64
	for _, r := range results {
		switch {
		case r.Err != nil:
		case r.Duplicate:
			dup++
		default:
			stored++
		}
	}
	in.m.events.WithLabelValues(streamID, "stored").Add(stored)
	in.m.events.WithLabelValues(streamID, "duplicate").Add(dup)
}

func (in *Ingress) countRefused(streamID string, refused []postbox.Reply) {
	if len(refused) > 0 {
		in.m.events.WithLabelValues(streamID, "rejected").Add(float64(len(refused)))
	}
}
