// Package outboxkafka relays an outbox into a Kafka topic: its Publisher is
// an outbox.Publisher that produces one record per message, through
// franz-go's idempotent producer with acks=all, and ACKs a message once
// every in-sync replica of its partition has it.
//
// A record's value is the message Body; its headers are the event id
// (HeaderEventID) and the message's other fields (HeaderEventType,
// HeaderCorrelationID, HeaderTenantID, HeaderCreatedAt); its key is chosen
// by Config.Key, and Kafka's partitioner sends every record of one key to
// one partition, so that consumers see them in order.
//
// The key defaults to the event's correlation id (KeyCorrelationID), and
// to its event id when it has none. An outbox.Message carries no
// aggregate id: a service that wants per-aggregate order sets the event's
// CorrelationID to the aggregate's id, or gives Config.Key a function of
// its own.
//
// Order. The records of one Publish are produced in the order of msgs,
// and the idempotent producer keeps them in that order within a partition
// across its own retries. A record that fails for a reason that may pass
// (an outage, or a refusal the relay retries) holds back the later records
// of the same key in the same Publish: they are answered with an outage
// NACK even if Kafka stored them, so the relay sends them again after the
// failed one and never settles them delivered ahead of it. Kafka may then
// hold a record twice; consumers deduplicate on the event id (package
// dedup). A record refused for good is parked, and no longer holds back
// the records after it. Order across concurrent Publish calls is the
// relay's (see outbox.RelayConfig.MaxInFlight): set the relay's window to
// one batch when strict per-key order matters more than throughput.
//
// Kafka's idempotent producer removes the duplicates of its own retries
// within one producer session only. A batch the relay sends again (after a
// lost reply, a restart, or a record held back) is produced again, so
// delivery is at least once.
package outboxkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
)

// Headers set on every record. A header whose value is empty (no tenant,
// say) is left out.
const (
	HeaderEventID       = "postbox-event-id"
	HeaderEventType     = "postbox-event-type"
	HeaderCorrelationID = "postbox-correlation-id"
	HeaderTenantID      = "postbox-tenant-id"
	HeaderCreatedAt     = "postbox-created-at" // RFC 3339, nanoseconds, UTC
	// W3C trace context, as OpenTelemetry's Kafka instrumentations
	// carry it.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Defaults of Config.
const (
	DefaultClientID = "postbox-relay"
	// DefaultMaxRecordBytes is franz-go's default largest record batch,
	// just under Kafka's default message.max.bytes (1,048,588).
	DefaultMaxRecordBytes = 1_000_012
	// DefaultDeliveryTimeout bounds how long a record may wait for its
	// acknowledgement before it fails as an outage.
	DefaultDeliveryTimeout = 30 * time.Second
)

// KeyFunc returns the record key of a message. A nil key sends records
// to partitions in turn, with no order between them.
type KeyFunc func(outbox.Message) []byte

// KeyCorrelationID keys a record by the event's correlation id, or by its
// event id when it has none. The default.
func KeyCorrelationID(m outbox.Message) []byte {
	if m.CorrelationID != "" {
		return []byte(m.CorrelationID)
	}
	return []byte(m.EventID)
}

// KeyEventID keys a record by its event id: records spread over the
// partitions, with no order between events.
func KeyEventID(m outbox.Message) []byte { return []byte(m.EventID) }

// KeyTenantID keys a record by the event's tenant id, or by its event id
// when it has none.
func KeyTenantID(m outbox.Message) []byte {
	if m.TenantID != "" {
		return []byte(m.TenantID)
	}
	return []byte(m.EventID)
}

// Config configures a Publisher.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Topic is the topic every record is produced to. Required; it must
	// exist unless the brokers create topics on first use.
	Topic string
	// Key returns a record's key. Defaults to KeyCorrelationID.
	Key KeyFunc
	// ClientID is the Kafka client id. Defaults to DefaultClientID.
	ClientID string
	// MaxRecordBytes is the largest record batch the producer builds,
	// headers and framing included. A record that does not fit in a
	// batch on its own is refused (parked) without being sent. Set it to
	// the topic's max.message.bytes when that is smaller than the
	// default: a batch larger than the topic takes is refused by the
	// broker as a whole, and its records are then NACKed retryable (see
	// Publisher). Defaults to DefaultMaxRecordBytes.
	MaxRecordBytes int
	// DeliveryTimeout bounds the wait for one record's acknowledgement.
	// Defaults to DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration
	// Options are further franz-go options, applied before the
	// Publisher's own: TLS (kgo.DialTLSConfig), SASL (kgo.SASL), a dialer.
	// The Publisher's own (seed brokers, client id, acks=all, idempotence,
	// batch size, delivery timeout) take precedence.
	Options []kgo.Opt
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Now stamps the ACKs. Defaults to time.Now.
	Now func() time.Time
}

// Publisher is an outbox.Publisher that produces each message to a Kafka
// topic. It is safe for concurrent use; concurrent batches share one
// franz-go client and its idempotent producer.
//
// Publish NACKs a message only for a refusal that is about that message;
// whatever stops every message alike is an outage, so that the relay
// pauses and sends again without counting an attempt.
//
//   - Non-retryable NACK, parked at once: a record too large to fit in a
//     batch of MaxRecordBytes on its own (CodeTooLarge), a record the
//     broker finds invalid (INVALID_RECORD, INVALID_TIMESTAMP).
//   - Retryable NACK (CodeUnavailable), counted towards the relay's
//     MaxAttempts: MESSAGE_TOO_LARGE from the broker, which refuses the
//     whole batch the record was in (MaxRecordBytes is above the topic's
//     max.message.bytes): the record that is too large is parked after
//     MaxAttempts, the others pass when sent again; authorization
//     failures (TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED
//     for the idempotent producer), and a topic name the broker refuses.
//     These refuse every message alike, but only an operator can end
//     them, so they park after MaxAttempts rather than wait for ever.
//   - Outage: everything else, that is brokers unreachable, connections
//     cut, retriable Kafka errors (no leader, not enough replicas, a
//     timeout) past the producer's own retries, an unknown topic, the
//     DeliveryTimeout or the context ending. When every message of a
//     Publish failed so, Publish returns an error; otherwise the failed
//     ones are answered with an outage NACK (postbox.CodeOutage). Either
//     way the relay pauses and sends them again.
type Publisher struct {
	cl  *kgo.Client
	cfg Config
	log *slog.Logger
}

var _ outbox.Publisher = (*Publisher)(nil)

// New returns a Publisher producing to cfg.Topic. It connects lazily;
// Close closes its client.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("outboxkafka: Config.Brokers is required")
	}
	if err := validTopic(cfg.Topic); err != nil {
		return nil, fmt.Errorf("outboxkafka: topic %q: %w", cfg.Topic, err)
	}
	if cfg.MaxRecordBytes < 0 || cfg.DeliveryTimeout < 0 {
		return nil, errors.New("outboxkafka: MaxRecordBytes and DeliveryTimeout must not be negative")
	}
	if cfg.Key == nil {
		cfg.Key = KeyCorrelationID
	}
	if cfg.ClientID == "" {
		cfg.ClientID = DefaultClientID
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.DeliveryTimeout == 0 {
		cfg.DeliveryTimeout = DefaultDeliveryTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	opts := append(append([]kgo.Opt(nil), cfg.Options...),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes)),
		kgo.RecordDeliveryTimeout(cfg.DeliveryTimeout),
		kgo.ProducerLinger(0),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("outboxkafka: %w", err)
	}
	return &Publisher{cl: cl, cfg: cfg, log: cfg.Logger}, nil
}

// Close closes the Publisher's client. Records not yet acknowledged fail.
func (p *Publisher) Close() { p.cl.Close() }

// Ping checks that a broker answers.
func (p *Publisher) Ping(ctx context.Context) error {
	if err := p.cl.Ping(ctx); err != nil {
		return fmt.Errorf("outboxkafka: %w", err)
	}
	return nil
}

// validTopic checks Kafka's rules for a topic name.
func validTopic(t string) error {
	switch {
	case t == "":
		return errors.New("is empty")
	case t == "." || t == "..":
		return errors.New("cannot be . or ..")
	case len(t) > 249:
		return fmt.Errorf("is %d characters, over 249", len(t))
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("holds %q: only ASCII letters, digits, '.', '_' and '-' are allowed", c)
		}
	}
	return nil
}

// Record returns the record a message is produced as.
func (p *Publisher) Record(m outbox.Message) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, 7)
	add := func(k, v string) {
		if v != "" {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	add(HeaderEventID, m.EventID)
	add(HeaderEventType, m.Type)
	add(HeaderCorrelationID, m.CorrelationID)
	add(HeaderTenantID, m.TenantID)
	if !m.CreatedAt.IsZero() {
		add(HeaderCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	}
	add(HeaderTraceParent, m.TraceParent)
	add(HeaderTraceState, m.TraceState)
	return &kgo.Record{Topic: p.cfg.Topic, Key: p.cfg.Key(m), Value: m.Body, Headers: hs}
}

// Publish implements outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	if len(msgs) == 0 {
		return []postbox.Reply{}, nil
	}
	// errs is written by the promises and read only after all of them
	// ran: if ctx ends first, Publish returns without reading it.
	errs := make([]error, len(msgs))
	recs := make([]*kgo.Record, len(msgs))
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	for i, m := range msgs {
		recs[i] = p.Record(m)
		p.cl.Produce(ctx, recs[i], func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		// Records already sent are kept by the idempotent producer until
		// acknowledged or DeliveryTimeout; the relay sends them again.
		return nil, fmt.Errorf("outboxkafka: waiting for acks from %s: %w", p.cfg.Topic, context.Cause(ctx))
	}

	now := p.cfg.Now()
	replies := make([]postbox.Reply, len(msgs))
	held := map[string]string{} // key → the event id that holds it back
	outages := 0
	var firstOutage error
	for i, m := range msgs {
		key := string(recs[i].Key)
		hasKey := recs[i].Key != nil
		if by, ok := held[key]; ok && hasKey {
			replies[i] = postbox.Nack(m.EventID, &postbox.FieldError{Code: postbox.CodeOutage,
				Message: fmt.Sprintf("held back behind %s, an earlier record of the same key that failed", by)})
			continue
		}
		err := errs[i]
		if err == nil {
			replies[i] = postbox.Ack(m.EventID, now, false)
			continue
		}
		switch kind, why := classify(err, p.cfg.Topic); kind {
		case refusal:
			replies[i] = postbox.Nack(m.EventID, why)
			continue
		case retryable:
			replies[i] = postbox.Nack(m.EventID, why)
		default:
			outages++
			if firstOutage == nil {
				firstOutage = err
			}
			replies[i] = postbox.Nack(m.EventID, &postbox.FieldError{Code: postbox.CodeOutage, Message: "kafka: " + err.Error()})
		}
		if hasKey {
			held[key] = m.EventID
		}
	}
	if outages == len(msgs) {
		return nil, fmt.Errorf("outboxkafka: produce to %s: %w", p.cfg.Topic, firstOutage)
	}
	if outages > 0 {
		p.log.Warn("outboxkafka: records failed", "topic", p.cfg.Topic, "failed", outages, "of", len(msgs), "err", firstOutage)
	}
	return replies, nil
}

type errorKind int

const (
	outage errorKind = iota
	refusal
	retryable
)

// classify sorts the error of one record (see Publisher) and returns, for
// a refusal, the reason to NACK with.
func classify(err error, topic string) (errorKind, error) {
	switch {
	case errors.Is(err, kerr.MessageTooLarge) && !strings.Contains(err.Error(), ", compressed_bytes="):
		// Failed by the producer itself: the record alone does not fit
		// in a batch. The broker's refusal names the batch's compressed
		// size too.
		return refusal, &postbox.FieldError{Code: postbox.CodeTooLarge, Message: "kafka: the record does not fit in a batch of MaxRecordBytes: " + err.Error()}
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.InvalidTimestamp):
		return refusal, &postbox.FieldError{Code: postbox.CodeInvalidField, Message: "kafka refused the record: " + err.Error()}
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return retryable, fmt.Errorf("kafka refused the batch holding this record as too large for topic %s (lower MaxRecordBytes to the topic's max.message.bytes): %w", topic, err)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed), errors.Is(err, kerr.InvalidTopicException):
		return retryable, fmt.Errorf("kafka refused the record for topic %s: %w", topic, err)
	}
	return outage, nil
}
