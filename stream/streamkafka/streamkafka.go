// Package streamkafka is the Kafka stream backend: each postbox stream is
// one Kafka topic of one partition, each event one record, and an event's
// offset is its Kafka offset plus one.
//
// # Topics and offsets
//
// The stream of source id S is the topic Prefix+encode(S) (letters,
// digits, '-' and '.' as they are, every other byte as _XX; a long id is
// cut and ends in a hash), created with one partition,
// Config.ReplicationFactor replicas, retention.ms=-1 and
// retention.bytes=-1: postbox trims a stream itself (Trim, by
// DeleteRecords), never Kafka's retention behind its back. The source id,
// the topic and the stream's creation time are rows of the index (below),
// from which Streams reads them.
//
// One partition, because postbox's contract is one dense sequence of
// offsets per stream, 1, 2, 3, ..., in the order events were stored, and
// Kafka orders records only within a partition. A partition's offsets are
// dense as long as no transaction writes to it (a commit marker takes an
// offset) and nothing compacts it: the Backend produces with the
// idempotent producer, never in a transaction, and creates its topics with
// cleanup.policy=delete. Offset o of a stream is Kafka offset o-1, so a
// consumer group's committed offset (the next record to read) is the
// postbox consumer's NextOffset minus one, and Kafka's own tools show the
// same lag as postbox. A stream's throughput is then one partition's,
// tens of thousands of events a second; postbox spreads load across
// streams (sources), not within one.
//
// # Stored once, forever
//
// Kafka's idempotent producer removes the duplicates of its own retries
// within one producer session only, and Kafka has no conditional write.
// postbox's promise is per identity (stream, native id, variant), across
// restarts and across processes. The Backend therefore keeps an identity
// index in a SQL database (Config.Index: a SQLite file for one node, or
// PostgreSQL, which the nodes of a cluster share), one row per identity
// with its type, a SHA-256 of its payload, the claim that stores it, and
// its offset once stored. Append runs in three steps:
//
//  1. Claim. One transaction inserts a row for every identity of the call
//     that the index does not hold, with no offset yet and a claim (a
//     token of its own, the event's position in the call) that ends
//     Config.ClaimTimeout from now, and reads the rows of those it could
//     not insert. An identity the index holds with an offset is a
//     Duplicate (same type and payload hash) or a *stream.ConflictError
//     and is not produced; one held by a live claim of another Append
//     (two agents sent the same event to two nodes) is waited for.
//  2. Produce. The claimed events are produced to the topic with acks=all
//     and the idempotent producer, each within half the claim timeout:
//     a record the broker has not acknowledged by then fails, and the
//     producer does not send it again. Append's results come from here:
//     an event is acknowledged only once every in-sync replica has it.
//  3. Settle. One transaction inserts one settle row for the claim: the
//     offsets of the events produced, by position, and their stored time,
//     which they share. An identity row whose claim has a settle row is
//     stored, at the offset of its position; the identity rows themselves
//     are not written again. It deletes the claims of events the broker
//     refused as too large. When some event was not acknowledged, the
//     settle writes each acknowledged event's offset and stored time into
//     its own row instead, so that a claim with a settle row is never one
//     still to resolve; so does the resolution of an expired claim
//     (below). Should the settle fail, Append still returns its results
//     (Kafka holds the events) and logs the failure; the rows are
//     resolved as a crash's are (below).
//
// An Append waits for another's claim only after it produced and settled
// the rest of its call, and then claims what it waited for in a new
// round: it never holds a claim while it waits, so two Appends waiting
// for each other's claims cannot both outwait them and both produce. The
// events it waited for then take offsets after the rest of its call.
//
// A process that dies between 1 and 3 leaves rows with an expired claim,
// and so does an Append that fails after its claim (brokers unreachable
// past the delivery timeout, its context ending): a record in flight may
// still be stored. Whoever next meets such a row (a redelivery of that
// event, a Lookup) takes the claim over and looks for the event in the
// topic before producing it: it reads the records stored since the claim
// was made (Kafka's offsets-for-times, from a minute before it), each
// carrying its identity in its key and headers. Found, the row takes its
// offset; not found, the event is produced now (by Append) or the row is
// deleted (by Lookup, which reports stream.ErrNotFound, as for a live
// claim). Waiting out the claim is what makes this safe: a record of the
// dead process that was acknowledged is in the topic, and one that was
// not can no longer be, since it failed at half the claim timeout. The
// cost of a crash, or of a failed Append, is that redeliveries of the
// events it had claimed wait up to ClaimTimeout.
//
// Claims expire by one clock: on PostgreSQL the database's
// (clock_timestamp()), which every process sharing the index reads; on
// SQLite, which serves one process, that process's. franz-go refuses a
// delivery timeout under a second, hence MinClaimTimeout.
//
// The index is written twice per Append call, not per event: with
// postbox's group commit, one claim and one settle transaction cover a
// whole batch, and the settle writes one row, not one per event. Trim
// deletes the rows of the events it deletes, and the settle rows all of
// whose events it deleted: as on the other backends, an event deleted by
// Trim is forgotten, and a redelivery after that is stored again. Streams (source id, topic, creation time)
// are rows of the index too: a stream exists once its row does, which
// EnsureStream inserts after creating the topic.
//
// The other choices were an index in a compacted Kafka topic (no
// conditional write: two processes could both find an identity missing
// and both produce it) and Kafka transactions with one transactional id
// per stream (its fencing would serialise every node on one producer per
// stream, and every commit marker takes an offset, so offsets would no
// longer be dense).
//
// # Records
//
// A record's value is the event's payload, byte for byte, and its key the
// event's native id, so that Kafka's tools show both as they came. The
// rest of the event is in headers (see the Header constants), the record's
// timestamp is its StoredAt, to the millisecond (Kafka keeps milliseconds),
// and StoredAt never decreases along one Backend's appends to a stream, so
// that stream.StartAtTime is Kafka's offsets-for-times.
//
// # Consumers
//
// A postbox consumer is a Kafka consumer group, Prefix+"consumer."+id,
// with no members: its committed offset on the stream's partition is the
// consumer's NextOffset minus one, committed as a simple commit
// (generation -1, which Kafka accepts from a group with no members), and
// the commit's metadata holds the rest of stream.Consumer (its stream,
// start, created and updated times) as JSON. Deleting the consumer deletes
// the group. Commit, Reset and EnsureConsumer of one consumer are
// serialised within a Backend; Kafka has no compare-and-set on a
// committed offset, so two processes moving one consumer at once may both
// succeed (postbox moves a subscription's consumer from the one node that
// holds its loop).
//
// # Reading
//
// Read sends fetch requests on the Backend's own client to the leader of
// the stream's partition, with no wait: it returns the events the
// partition holds now, up to its limit, and never waits for more. What a
// fetch brought beyond the limit is kept for the consumer's next Read,
// which a reader going forwards starts from. Lag and Stats come from the
// broker's start and end offsets (Stats' times from the first and last
// records), at_time from its offsets-for-times. Wait wakes at once on this
// Backend's own appends and asks the broker for the end offset every
// 100 ms for those of other processes. Trim moves the partition's log
// start (DeleteRecords) no further than the first event stored at or after
// its time and the lowest committed offset of the stream's consumers.
//
// The Backend passes streamtest with no feature flags, on one broker and
// on three with every topic on three replicas.
//
// # What an ack promises
//
// Append returns once Kafka acknowledged every event with acks=all: every
// in-sync replica of the partition has it (min.insync.replicas of the
// topic or broker says how many that must be at least). Kafka does not
// fsync on acknowledgement; its durability is replication.
package streamkafka

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-events/postbox/stream"
)

var (
	_ stream.Backend = (*Backend)(nil)
	_ stream.Waiter  = (*Backend)(nil)
	_ stream.Trimmer = (*Backend)(nil)
	_ stream.Scanner = (*Backend)(nil)
)

// BackendName is what Stream.Backend says.
const BackendName = "kafka"

// Defaults of Config.
const (
	DefaultPrefix       = "postbox."
	DefaultClientID     = "postbox"
	DefaultIndexSchema  = "postbox"
	DefaultClaimTimeout = 10 * time.Second
	// DefaultReplicationFactor (-1) leaves it to the broker's
	// default.replication.factor.
	DefaultReplicationFactor = -1
	// DefaultMaxRecordBytes is the largest record batch the producer
	// builds: Kafka's default max.message.bytes.
	DefaultMaxRecordBytes = 1 << 20
	// MinClaimTimeout is the shortest ClaimTimeout Open accepts: half of
	// it is the record delivery timeout, which franz-go wants at least
	// a second.
	MinClaimTimeout = 2 * time.Second
)

// Config configures a Backend. Zero fields take their defaults.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Index is where the identity index lives: a SQLite file's path, or
	// a PostgreSQL URL (postgres://… or postgresql://…), which several
	// postbox processes on one Kafka must share. Required.
	Index string
	// IndexSchema is the PostgreSQL schema of the index's tables
	// (kafka_streams, kafka_identities, kafka_settles), created if
	// needed. Defaults to DefaultIndexSchema; ignored for SQLite.
	IndexSchema string
	// Prefix begins the name of every topic and consumer group the
	// Backend makes, so that several postbox installations (or tests) can
	// share one Kafka. Letters, digits, '.', '_' and '-'. Defaults to
	// DefaultPrefix.
	Prefix string
	// ReplicationFactor of the topics the Backend creates. Defaults to
	// DefaultReplicationFactor, the broker's default.
	ReplicationFactor int16
	// ClientID is the Kafka client id. Defaults to DefaultClientID.
	ClientID string
	// ClaimTimeout is how long a claim on an identity lasts before
	// another Append may take it over (see the package doc); a record is
	// given half of it to be acknowledged. At least MinClaimTimeout.
	// Defaults to DefaultClaimTimeout.
	ClaimTimeout time.Duration
	// MaxRecordBytes is the largest record batch the producer builds;
	// an event that does not fit in one on its own is refused with
	// stream.ErrTooLarge. Set it to the topics' max.message.bytes when
	// that is smaller. Defaults to DefaultMaxRecordBytes.
	MaxRecordBytes int
	// Options are further franz-go options, applied before the
	// Backend's own: TLS (kgo.DialTLSConfig), SASL (kgo.SASL), a dialer.
	Options []kgo.Opt
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Backend stores streams in Kafka. Open one with Open; it is safe for
// concurrent use.
type Backend struct {
	cfg Config
	log *slog.Logger
	cl  *kgo.Client  // the producer, and the client of adm and of fetches
	adm *kadm.Client // admin requests: topics, offsets, groups
	idx *index

	pubMu     sync.Mutex // produces in stamp order
	lastStamp time.Time

	mu      sync.Mutex
	streams map[string]*streamState // streams known to exist, by id
	leaders map[string]leader       // partition 0's leader, by topic
	locks   map[string]*consumerLock
	readers map[string]*readBuffer

	closed    chan struct{}
	closeOnce sync.Once

	// hooks for tests: called between the steps of Append; an error
	// ends the Append there, as a crash would.
	beforeProduce, beforeSettle func() error
}

// streamState is what the Backend keeps of one stream.
type streamState struct {
	streamRow
	last atomic.Int64 // the highest offset this Backend saw
	mu   sync.Mutex
	grew chan struct{} // closed when last grows
}

// grow records that st holds offset and wakes its waiters.
func (st *streamState) grow(offset int64) {
	for {
		cur := st.last.Load()
		if offset <= cur {
			return
		}
		if st.last.CompareAndSwap(cur, offset) {
			break
		}
	}
	st.mu.Lock()
	close(st.grew)
	st.grew = make(chan struct{})
	st.mu.Unlock()
}

func (st *streamState) grown() <-chan struct{} {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.grew
}

// Open connects to the brokers and opens (creating and migrating) the
// identity index, and returns the Backend.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("streamkafka: Config needs Brokers")
	}
	if cfg.Index == "" {
		return nil, errors.New("streamkafka: Config needs an Index (a SQLite file or a PostgreSQL URL)")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	for _, c := range cfg.Prefix {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return nil, fmt.Errorf("streamkafka: prefix %q: only letters, digits, '.', '_' and '-'", cfg.Prefix)
		}
	}
	if len(cfg.Prefix) > len(DefaultPrefix)+40 {
		return nil, fmt.Errorf("streamkafka: prefix %q: at most %d bytes", cfg.Prefix, len(DefaultPrefix)+40)
	}
	if cfg.ClaimTimeout < 0 || cfg.MaxRecordBytes < 0 {
		return nil, errors.New("streamkafka: ClaimTimeout and MaxRecordBytes must not be negative")
	}
	if cfg.ClientID == "" {
		cfg.ClientID = DefaultClientID
	}
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = DefaultReplicationFactor
	}
	if cfg.ClaimTimeout == 0 {
		cfg.ClaimTimeout = DefaultClaimTimeout
	}
	if cfg.ClaimTimeout < MinClaimTimeout {
		return nil, fmt.Errorf("streamkafka: ClaimTimeout %v: at least %v", cfg.ClaimTimeout, MinClaimTimeout)
	}
	if cfg.MaxRecordBytes == 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.IndexSchema == "" {
		cfg.IndexSchema = DefaultIndexSchema
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, streams: map[string]*streamState{}, leaders: map[string]leader{},
		locks: map[string]*consumerLock{}, readers: map[string]*readBuffer{}, closed: make(chan struct{})}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	opts := append(slices.Clone(cfg.Options),
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes)),
		kgo.RecordDeliveryTimeout(cfg.ClaimTimeout/2),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("streamkafka: %w", err)
	}
	b.cl, b.adm = cl, kadm.NewClient(cl)
	if b.idx, err = openIndex(ctx, cfg); err != nil {
		cl.Close()
		return nil, fmt.Errorf("streamkafka: %w", err)
	}
	return b, nil
}

// Close closes the Kafka client and the index. Calls in progress end
// with an error; records not yet acknowledged fail, and their claims
// expire (see the package doc).
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.closed)
		b.cl.Close()
		err = b.idx.close()
	})
	return err
}

// EnsureStream implements stream.Backend: it creates the topic (one
// found is used as it is) and then the index's row. The stream id is the
// source id.
func (b *Backend) EnsureStream(ctx context.Context, sourceID string) (stream.Stream, error) {
	if sourceID == "" {
		return stream.Stream{}, errors.New("ensure stream: empty source id")
	}
	if st, err := b.stream(ctx, sourceID); err == nil {
		return st.public(), nil
	} else if !errors.Is(err, stream.ErrStreamNotFound) {
		return stream.Stream{}, err
	}
	topic := TopicName(b.cfg.Prefix, sourceID)
	resp, err := b.adm.CreateTopic(ctx, 1, b.cfg.ReplicationFactor, map[string]*string{
		"retention.ms":    kadm.StringPtr("-1"),
		"retention.bytes": kadm.StringPtr("-1"),
		"cleanup.policy":  kadm.StringPtr("delete"),
	}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: create topic %s: %w", sourceID, topic, err)
	}
	if _, err := b.idx.addStream(ctx, sourceID, topic, time.Now()); err != nil {
		return stream.Stream{}, fmt.Errorf("ensure stream %s: %w", sourceID, err)
	}
	st, err := b.stream(ctx, sourceID)
	if err != nil {
		return stream.Stream{}, err
	}
	return st.public(), nil
}

func (r *streamRow) public() stream.Stream {
	return stream.Stream{ID: r.id, SourceID: r.id, Backend: BackendName, CreatedAt: r.created}
}

// stream returns the state of streamID, or an error wrapping
// stream.ErrStreamNotFound when the index has no such stream. Streams
// found are remembered: a stream is never deleted.
func (b *Backend) stream(ctx context.Context, id string) (*streamState, error) {
	if id == "" {
		return nil, fmt.Errorf("%w: empty id", stream.ErrStreamNotFound)
	}
	b.mu.Lock()
	st, ok := b.streams[id]
	b.mu.Unlock()
	if ok {
		return st, nil
	}
	row, ok, err := b.idx.stream(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s", stream.ErrStreamNotFound, id)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.streams[id]; ok {
		return old, nil
	}
	st = &streamState{streamRow: row, grew: make(chan struct{})}
	b.streams[id] = st
	return st, nil
}

// Streams implements stream.Backend, from the index.
func (b *Backend) Streams(ctx context.Context) ([]stream.Stream, error) {
	rows, err := b.idx.streams(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]stream.Stream, len(rows))
	for i := range rows {
		out[i] = rows[i].public()
	}
	return out, nil
}

// TopicName returns the topic of the stream of sourceID under prefix.
func TopicName(prefix, sourceID string) string {
	return prefix + encodeName(sourceID, maxTopicLen-len(prefix))
}

// maxTopicLen is Kafka's longest topic name.
const maxTopicLen = 249

// encodeName makes s a part of a topic name: letters, digits, '-' and
// '.' as they are, every other byte as _XX, and a name longer than room
// cut and ended by a hash of s.
func encodeName(s string, room int) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "_%02X", c)
	}
	out := b.String()
	if max := room; len(out) > max {
		sum := sha256.Sum256([]byte(s))
		out = out[:max-33] + "_" + hex.EncodeToString(sum[:16])
	}
	return out
}
