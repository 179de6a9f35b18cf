package outboxredis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/outbox"
)

// DefaultProducerID is the IDMP producer id of a Publisher whose config
// names none.
const DefaultProducerID = "postbox-outbox"

// IDMPMode says whether a Publisher asks Redis to drop resent events.
type IDMPMode int

const (
	// IDMPAuto uses IDMP when the server says it is Redis 8.6 or later
	// (INFO server, redis_version, read once per Publisher).
	IDMPAuto IDMPMode = iota
	// IDMPOff always sends a plain XADD.
	IDMPOff
	// IDMPOn always sends XADD IDMP, for a server whose INFO does not tell
	// (a proxy). A server without IDMP refuses every XADD, and every event
	// is NACKed.
	IDMPOn
)

// Config configures a Publisher, as outboxnats.Config and
// outboxkafka.Config configure theirs; ConsumerConfig configures a
// Consumer.
type Config struct {
	// Stream is the key of the stream events are appended to. Required.
	Stream string
	// MaxLen, when positive, trims the stream on every XADD to about
	// MaxLen entries (MAXLEN ~ MaxLen: Redis trims whole nodes, so the
	// stream may hold somewhat more). 0 means no trimming, and the stream
	// grows until something else trims it.
	//
	// Trimming does not wait for consumers: an entry trimmed before a
	// consumer group read it is lost to that group, and one trimmed while
	// pending is dropped from the group's pending list without being
	// handled. Size MaxLen for the longest outage of the slowest group
	// (events per second × seconds), or trim elsewhere (XTRIM MINID after
	// every group's last delivered ID).
	MaxLen int64
	// IDMP chooses idempotent production (Redis 8.6+: XADD key IDMP
	// producer-id event-id * ...). Redis then remembers, per stream and
	// producer, the most recent event IDs it appended and answers a resent
	// one with the ID of the entry already there, appending nothing. It
	// remembers IDMP-MAXSIZE IDs (default 100, at most 10,000) for
	// IDMP-DURATION seconds (default 100, at most 86,400), set per stream
	// with XCFGSET (which also forgets the IDs remembered so far). The
	// defaults are smaller than one relay batch, so set them once per
	// stream, for example
	//
	//	XCFGSET orders IDMP-DURATION 86400 IDMP-MAXSIZE 10000
	//
	// Outside that window a resent event is appended again, so consumers
	// still deduplicate. Defaults to IDMPAuto.
	//
	// Not tested against a real Redis 8.6: the machine this was written on
	// runs Redis 7.0.15. The tests check the arguments on the wire (with a
	// fake server that says it is 8.6) and the version detection.
	IDMP IDMPMode
	// ProducerID is the IDMP producer id. Every relay of one outbox must
	// use the same one: a resend may come from another relay. Defaults to
	// DefaultProducerID.
	ProducerID string
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Now stamps the ACKs. Defaults to time.Now.
	Now func() time.Time
}

// PublisherConfig is the former name of Config.
//
// Deprecated: use Config.
type PublisherConfig = Config

// Publisher is an outbox.Publisher that appends each message to a Redis
// stream: one pipeline of one XADD per message, in order. Concurrent
// Publish calls use the client's connection pool.
//
// Replies: an appended message is ACKed; one Redis refused (WRONGTYPE, a
// syntax error, an ACL's NOPERM, …) is NACKed as unavailable, which is
// retryable, so the Relay sends it again later and parks it after
// RelayConfig.MaxAttempts. A transport failure, or a server that cannot
// take writes at all for now (OOM at maxmemory, MISCONF after a failed RDB
// save, BUSY running a long script, LOADING, READONLY after a failover,
// MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, too many clients, NOAUTH
// or WRONGPASS), fails the whole Publish: the Relay pauses and sends every
// message again, and outages do not count towards MaxAttempts.
type Publisher struct {
	client redis.UniversalClient
	cfg    Config
	log    *slog.Logger

	mu       sync.Mutex
	detected bool // IDMPAuto: the server version was read
	idmp     bool
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher appending to cfg.Stream through client.
func NewPublisher(client redis.UniversalClient, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("outboxredis: publisher needs a client")
	}
	if cfg.Stream == "" {
		return nil, errors.New("outboxredis: publisher needs a stream")
	}
	if cfg.MaxLen < 0 {
		return nil, errors.New("outboxredis: MaxLen must not be negative")
	}
	if cfg.IDMP < IDMPAuto || cfg.IDMP > IDMPOn {
		return nil, fmt.Errorf("outboxredis: unknown IDMP mode %d", cfg.IDMP)
	}
	if cfg.ProducerID == "" {
		cfg.ProducerID = DefaultProducerID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Publisher{client: client, cfg: cfg, log: cfg.Logger}
	switch cfg.IDMP {
	case IDMPOn:
		p.detected, p.idmp = true, true
	case IDMPOff:
		p.detected = true
	}
	return p, nil
}

// Publish implements outbox.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	if len(msgs) == 0 {
		return []postbox.Reply{}, nil
	}
	idmp, err := p.useIDMP(ctx)
	if err != nil {
		return nil, err
	}
	pipe := p.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(msgs))
	for i, m := range msgs {
		cmds[i] = pipe.XAdd(ctx, p.xaddArgs(m, idmp))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	now := p.cfg.Now()
	replies := make([]postbox.Reply, len(msgs))
	for i, cmd := range cmds {
		err := cmd.Err()
		switch {
		case err == nil:
			replies[i] = postbox.Ack(msgs[i].EventID, now, false)
		case refused(err):
			replies[i] = postbox.Nack(msgs[i].EventID, fmt.Errorf("redis refused XADD to %s: %w", p.cfg.Stream, err))
		default:
			return nil, fmt.Errorf("xadd to %s: %w", p.cfg.Stream, err)
		}
	}
	return replies, nil
}

// xaddArgs returns the XADD of m.
func (p *Publisher) xaddArgs(m outbox.Message, idmp bool) *redis.XAddArgs {
	values := make([]any, 0, 12)
	values = append(values,
		FieldEventID, m.EventID,
		FieldType, m.Type,
		FieldPayload, m.Body,
		FieldCorrelationID, m.CorrelationID,
	)
	if m.TenantID != "" {
		values = append(values, FieldTenantID, m.TenantID)
	}
	values = append(values, FieldCreatedAt, m.CreatedAt.UTC().Format(time.RFC3339Nano))
	if m.TraceParent != "" {
		values = append(values, FieldTraceParent, m.TraceParent)
		if m.TraceState != "" {
			values = append(values, FieldTraceState, m.TraceState)
		}
	}
	a := &redis.XAddArgs{Stream: p.cfg.Stream, Values: values}
	if p.cfg.MaxLen > 0 {
		a.MaxLen, a.Approx = p.cfg.MaxLen, true
	}
	if idmp {
		a.ProducerID, a.IdempotentID = p.cfg.ProducerID, m.EventID
	}
	return a
}

// useIDMP reports whether XADD carries IDMP, reading the server's version
// the first time (IDMPAuto). A transport failure or an outage (LOADING,
// BUSY, too many clients, NOAUTH, …: see refused) is returned, which fails
// the Publish as an outage, and the next Publish asks again: publishing
// without IDMP this once would append again the events of a resent batch
// that IDMP would drop, and a server in that state takes no XADD anyway.
// Only a server that refuses INFO itself (unknown command, an ACL) gets
// plain XADDs, for the Publisher's lifetime.
func (p *Publisher) useIDMP(ctx context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.detected {
		return p.idmp, nil
	}
	info, err := p.client.Info(ctx, "server").Result()
	if err != nil {
		if !refused(err) {
			return false, fmt.Errorf("read the redis version: %w", err)
		}
		p.log.Warn("outboxredis: the server refused INFO; publishing without IDMP", "err", err)
		p.detected = true
		return false, nil
	}
	version := infoField(info, "redis_version")
	p.detected, p.idmp = true, supportsIDMP(version)
	p.log.Info("outboxredis: publishing", "stream", p.cfg.Stream, "redis_version", version, "idmp", p.idmp)
	return p.idmp, nil
}

// infoField returns the value of name in an INFO reply ("name:value"
// lines), or "".
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v
		}
	}
	return ""
}

// supportsIDMP reports whether a redis_version has XADD IDMP (8.6.0 and
// later). Valkey reports redis_version 7.2.4 and has no IDMP.
func supportsIDMP(version string) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 8 || major == 8 && minor >= 6
}

// unavailable are the prefixes of the errors with which a server refuses
// every write for now: outages, not refusals of one event. A server at
// maxmemory (OOM), or one that failed its last RDB save (MISCONF, with
// stop-writes-on-bgsave-error), refuses every XADD until an operator acts,
// so parking the events it refused would only make more work. "BUSY " (a
// script or function running too long) keeps its space: BUSYGROUP and
// BUSYKEY are refusals of one command.
var unavailable = []string{"OOM", "MISCONF", "BUSY ", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"}

// refused reports whether err is Redis refusing one command (WRONGTYPE, a
// syntax error, an ACL's NOPERM), rather than a transport failure, a
// cancelled context, or a server that takes no writes for now (unavailable,
// too many clients, or a connection that is not authenticated: NOAUTH,
// WRONGPASS).
func refused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	if redis.IsMaxClientsError(err) || redis.IsAuthError(err) {
		return false
	}
	for _, prefix := range unavailable {
		if redis.HasErrorPrefix(err, prefix) {
			return false
		}
	}
	return true
}
