// Package outboxnats relays an outbox into NATS JetStream: its Publisher is
// an outbox.Publisher that appends each message to a stream, on the
// subject <prefix>.<event type>, and answers with JetStream's PubAck.
//
// A batch is pipelined: every message is published asynchronously
// (PublishMsgAsync) on the caller's connection, and Publish then waits for
// all the PubAcks. Each message carries its event id as Nats-Msg-Id, so
// the server drops a message it already stored within the stream's
// duplicate window and answers it as a duplicate; Publish turns that into
// an ACK with Duplicate set.
//
// JetStream's duplicate window is a window, not a promise. The server
// remembers message ids for the stream's Duplicates duration only
// (DefaultDuplicates, 2 minutes, unless the stream says otherwise), and
// keeps all of them in memory. A redelivery after the window (the relay
// was down longer, or a settle failed and the row was sent again later)
// is stored a second time. This is why consumers deduplicate on the
// event id themselves (the dedup package), and why a longer window is a
// trade of server memory for fewer duplicates, not a fix.
//
// A PubAck is an ACK. A refusal of one message is its NACK; a failure of
// the stream, the server or the connection fails the whole batch, which
// the relay sends again. Publisher lists which is which.
package outboxnats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
)

// Headers set on every message besides jetstream.MsgIDHeader
// (Nats-Msg-Id), which holds the event id. A header whose value is empty
// (no tenant, say) is left out.
const (
	HeaderEventType     = "Postbox-Event-Type"
	HeaderCorrelationID = "Postbox-Correlation-Id"
	HeaderTenantID      = "Postbox-Tenant-Id"
	HeaderCreatedAt     = "Postbox-Created-At" // RFC 3339, nanoseconds, UTC
	// W3C trace context, when the message has one.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Defaults of Config.
const (
	// DefaultDuplicates is the duplicate window of a stream the Publisher
	// creates: JetStream's own default.
	DefaultDuplicates = 2 * time.Minute
	// DefaultAckTimeout bounds the wait for one batch's PubAcks.
	DefaultAckTimeout = 30 * time.Second
)

// Config configures a Publisher.
type Config struct {
	// Stream is the JetStream stream the messages are stored in. Required.
	Stream string
	// SubjectPrefix is the first token(s) of every subject: a message is
	// published on SubjectPrefix + "." + its event type, so an event of
	// type "order.created" goes to "<prefix>.order.created". The stream
	// must listen on these subjects. Defaults to Stream.
	SubjectPrefix string
	// CreateStream creates the stream, on the first Publish, if it does
	// not exist: file storage, subjects "<SubjectPrefix>.>", duplicate
	// window Duplicates. An existing stream is used as it is.
	CreateStream bool
	// Duplicates is the duplicate window of a stream created by
	// CreateStream. Defaults to DefaultDuplicates.
	Duplicates time.Duration
	// AckTimeout bounds the wait for one batch's PubAcks; a batch not
	// answered by then fails as a whole. Defaults to DefaultAckTimeout.
	AckTimeout time.Duration
}

// Publisher is an outbox.Publisher that stores messages in a JetStream
// stream. It is safe for concurrent use; concurrent batches share the
// JetStream context's asynchronous publisher.
//
// Publish NACKs a message only for a refusal that is about that message.
// Whatever would refuse every message alike fails the whole batch
// instead, so that the relay pauses and sends it again without counting
// an attempt: an outage never parks events (RelayConfig.MaxAttempts).
//
//   - Non-retryable NACK, parked at once: an event type that is not a
//     valid subject token (CodeInvalidField, field "type"); a message over
//     the server's max_payload, the stream's max_msg_size, the 64 KiB of
//     headers or the largest record the store takes (CodeTooLarge).
//   - Retryable NACK, counted towards MaxAttempts: a subject the stream
//     does not listen on (the stream is there, but its subjects do not
//     cover the event type); a subject at the stream's max_msgs_per_subject
//     with discard_new_per_subject; the message id being stored by another
//     publish at the same time; a wrong expected last sequence.
//   - An error for the batch: everything else. That is the stream missing
//     or sealed; nobody answering while the stream has no leader (one is
//     being elected); the stream full (max_msgs or max_bytes with
//     DiscardNew); JetStream short of resources or failing to store
//     ("insufficient resources", "stream store failed"); account limits;
//     any other API error, 503s included; PubAcks that do not arrive (the
//     connection closing or disconnecting, AckTimeout, the JetStream
//     context's own publish timeout) or cannot be read. An error code not
//     listed above fails the batch too: a refusal this package does not
//     know of holds the relay up, but never parks an event.
//
// Nobody answering a publish (no responders) means either that no stream
// listens on its subject or that the stream has no leader. Publish asks
// the server which stream listens on the subject and whether cfg.Stream
// exists, and NACKs only when the stream exists and does not listen on
// the subject. With CreateStream, a stream found missing this way is
// created again by the next Publish.
type Publisher struct {
	js  jetstream.JetStream
	cfg Config

	mu      sync.Mutex
	created bool // the stream was created or found (CreateStream only)
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher into cfg.Stream through js. The
// connection behind js belongs to the caller, who closes it.
func NewPublisher(js jetstream.JetStream, cfg Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("outboxnats: nil JetStream")
	}
	if cfg.Stream == "" {
		return nil, errors.New("outboxnats: Config.Stream is required")
	}
	if strings.ContainsAny(cfg.Stream, ".*> \t\r\n/\\") {
		return nil, fmt.Errorf("outboxnats: stream name %q must not hold '.', '*', '>', '/', '\\' or whitespace", cfg.Stream)
	}
	if cfg.SubjectPrefix == "" {
		cfg.SubjectPrefix = cfg.Stream
	}
	if err := validSubject(cfg.SubjectPrefix); err != nil {
		return nil, fmt.Errorf("outboxnats: subject prefix %q: %w", cfg.SubjectPrefix, err)
	}
	if cfg.Duplicates < 0 || cfg.AckTimeout < 0 {
		return nil, errors.New("outboxnats: Duplicates and AckTimeout must not be negative")
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = DefaultDuplicates
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	return &Publisher{js: js, cfg: cfg}, nil
}

// Subject returns the subject a message of eventType is published on, or
// an error saying why eventType cannot be part of a subject.
func (p *Publisher) Subject(eventType string) (string, error) {
	if eventType == "" {
		return "", errors.New("is empty")
	}
	if err := validSubject(eventType); err != nil {
		return "", err
	}
	return p.cfg.SubjectPrefix + "." + eventType, nil
}

// validSubject checks that s is a subject a message can be published on:
// tokens separated by '.', none empty, none holding whitespace or control
// characters, no wildcards ('*', '>').
func validSubject(s string) error {
	for tok := range strings.SplitSeq(s, ".") {
		if tok == "" {
			return errors.New("has an empty token (a leading, trailing or doubled '.')")
		}
		for _, c := range []byte(tok) {
			switch {
			case c <= ' ' || c == 0x7f:
				return fmt.Errorf("holds whitespace or a control character (%q)", c)
			case c == '*' || c == '>':
				return fmt.Errorf("holds the wildcard %q", c)
			}
		}
	}
	return nil
}

// ensureStream creates the stream on first use when the config asks for it.
func (p *Publisher) ensureStream(ctx context.Context) error {
	if !p.cfg.CreateStream {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.created {
		return nil
	}
	_, err := p.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       p.cfg.Stream,
		Subjects:   []string{p.cfg.SubjectPrefix + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: p.cfg.Duplicates,
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return fmt.Errorf("outboxnats: create stream %s: %w", p.cfg.Stream, err)
	}
	p.created = true
	return nil
}

// Publish implements outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	if err := p.ensureStream(ctx); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AckTimeout)
	defer cancel()
	nc := p.js.Conn()
	if nc.IsClosed() { // else the first publish says so, but without wrapping the error
		return nil, fmt.Errorf("outboxnats: %w", nats.ErrConnectionClosed)
	}
	// A closed connection fails the pending PubAcks of no future: listen
	// for it, or the wait below would last until the timeout.
	closed := nc.StatusChanged(nats.CLOSED)
	defer nc.RemoveStatusListener(closed)

	replies := make([]postbox.Reply, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	unbound := map[string]bool{} // subjects found not to be the stream's
	for i, m := range msgs {
		subject, err := p.Subject(m.Type)
		if err != nil {
			replies[i] = postbox.Nack(m.EventID, &postbox.FieldError{
				Field: "type", Code: postbox.CodeInvalidField,
				Message: fmt.Sprintf("type %q cannot be a NATS subject token: it %v", m.Type, err),
			})
			continue
		}
		f, err := p.publishAsync(ctx, &nats.Msg{Subject: subject, Data: m.Body, Header: header(m)})
		switch {
		case err == nil:
			futures[i] = f
		case errors.Is(err, nats.ErrMaxPayload):
			replies[i] = tooLarge(m, fmt.Sprintf("body of %d bytes (with headers) is over the server's max_payload of %d bytes", len(m.Body), nc.MaxPayload()))
		default:
			return nil, fmt.Errorf("outboxnats: publish %s: %w", m.EventID, err)
		}
	}

	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			replies[i] = postbox.Ack(msgs[i].EventID, time.Now(), ack.Duplicate)
		case err := <-f.Err():
			r, err := p.reply(ctx, msgs[i], f.Msg().Subject, err, unbound)
			if err != nil {
				return nil, fmt.Errorf("outboxnats: PubAck of %s: %w", msgs[i].EventID, err)
			}
			replies[i] = r
		case <-closed:
			return nil, fmt.Errorf("outboxnats: waiting for PubAcks: %w", nats.ErrConnectionClosed)
		case <-ctx.Done():
			return nil, fmt.Errorf("outboxnats: waiting for PubAcks: %w", context.Cause(ctx))
		}
	}
	return replies, nil
}

// publishAsync publishes m, waiting while the JetStream context has its
// maximum of PubAcks pending (each try stalls for a while, then fails with
// ErrTooManyStalledMsgs) until ctx ends.
func (p *Publisher) publishAsync(ctx context.Context, m *nats.Msg) (jetstream.PubAckFuture, error) {
	for {
		f, err := p.js.PublishMsgAsync(m)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			return f, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", err, context.Cause(ctx))
		}
	}
}

func header(m outbox.Message) nats.Header {
	h := nats.Header{jetstream.MsgIDHeader: {m.EventID}, HeaderEventType: {m.Type}}
	if m.CorrelationID != "" {
		h[HeaderCorrelationID] = []string{m.CorrelationID}
	}
	if m.TenantID != "" {
		h[HeaderTenantID] = []string{m.TenantID}
	}
	if !m.CreatedAt.IsZero() {
		h[HeaderCreatedAt] = []string{m.CreatedAt.UTC().Format(time.RFC3339Nano)}
	}
	if m.TraceParent != "" {
		h[HeaderTraceParent] = []string{m.TraceParent}
		if m.TraceState != "" {
			h[HeaderTraceState] = []string{m.TraceState}
		}
	}
	return h
}

func tooLarge(m outbox.Message, why string) postbox.Reply {
	return postbox.Nack(m.EventID, &postbox.FieldError{Code: postbox.CodeTooLarge, Message: why})
}

// Error codes of JetStream API errors that refuse one message, besides
// those the jetstream package names (nats-server's errors.json).
const (
	errCodeStreamStoreFailed        jetstream.ErrorCode = 10077 // its description is the store's error
	errCodeHeaderExceedsMaximum     jetstream.ErrorCode = 10097
	errCodeDuplicateMessageConflict jetstream.ErrorCode = 10158
)

// reply translates the error of one PubAck future into m's NACK when it
// refuses m alone (see Publisher). For any other error it returns an
// error: the whole batch fails. unbound caches, for one batch, the
// subjects found not to belong to the stream.
func (p *Publisher) reply(ctx context.Context, m outbox.Message, subject string, err error, unbound map[string]bool) (postbox.Reply, error) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		code, desc := apiErr.ErrorCode, apiErr.Description
		// The store's errors for one message; its others (max_msgs or
		// max_bytes reached, a write failing) refuse every message.
		storeFailed := code == errCodeStreamStoreFailed
		tooLargeForStore := storeFailed && (strings.Contains(desc, "message to large") || strings.Contains(desc, "message too large"))
		subjectFull := storeFailed && strings.Contains(desc, "maximum messages per subject exceeded")
		switch {
		case code == jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return tooLarge(m, fmt.Sprintf("body of %d bytes is over the stream's max_msg_size: %s", len(m.Body), desc)), nil
		case code == errCodeHeaderExceedsMaximum, tooLargeForStore:
			return tooLarge(m, fmt.Sprintf("body of %d bytes with its headers is too large for jetstream: %s", len(m.Body), desc)), nil
		case subjectFull,
			code == errCodeDuplicateMessageConflict,
			code == jetstream.JSErrCodeStreamWrongLastSequence,
			code == jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return postbox.Nack(m.EventID, fmt.Errorf("jetstream refused the message: %s (code %d, err_code %d)", desc, apiErr.Code, code)), nil
		}
		return postbox.Reply{}, err
	}
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, jetstream.ErrInvalidJSAck) {
		return postbox.Reply{}, err
	}
	// Nobody answered, or something that is not JetStream did.
	if !unbound[subject] {
		if name, lerr := p.js.StreamNameBySubject(ctx, subject); !errors.Is(lerr, jetstream.ErrStreamNotFound) {
			if lerr != nil {
				return postbox.Reply{}, fmt.Errorf("%w; looking up the stream of %s: %w", err, subject, lerr)
			}
			return postbox.Reply{}, fmt.Errorf("stream %s listens on %s but sent no PubAck (it has no leader, or one is being elected): %w", name, subject, err)
		}
		if _, lerr := p.js.Stream(ctx, p.cfg.Stream); lerr != nil {
			if errors.Is(lerr, jetstream.ErrStreamNotFound) {
				p.mu.Lock()
				p.created = false // CreateStream creates it again
				p.mu.Unlock()
			}
			return postbox.Reply{}, fmt.Errorf("%w; looking up stream %s: %w", err, p.cfg.Stream, lerr)
		}
		unbound[subject] = true
	}
	return postbox.Nack(m.EventID, fmt.Errorf("stream %s does not listen on subject %s (%v)", p.cfg.Stream, subject, err)), nil
}
