// Package outbox is postbox's one relay mechanism: a durable table of
// unsent events and a Relay loop that sends them, retries with backoff and
// jitter, and settles each row only after the receiver answered it.
//
// The edge agent's outbox (outboxsqlite) and the transactional outbox of a
// service's own database are both a Store; the ingress client, Redis
// Streams and JetStream are each a Publisher. The Relay is the same for
// all of them.
//
// Guarantees: a row leaves the outbox (deleted or marked delivered) only
// after the Publisher returned an ACK for it; a row refused with a
// non-retryable NACK is kept as rejected with the reason, for an operator
// to inspect and requeue; everything else is sent again until ACKed.
// Rows are sent in outbox order, but with many batches in flight and
// retries, the receiver may see them in another order.
package outbox

import (
	"context"
	"time"

	"github.com/postbox-events/postbox"
)

// Message is one outbox row handed to a Publisher.
type Message struct {
	Seq       int64 // the row's position in the outbox; grows with each insert
	EventID   string
	Type      string
	Body      []byte // what is sent: for the edge outbox, the envelope JSON
	Attempts  int    // sends so far that got no ACK
	CreatedAt time.Time
}

// Publisher sends messages to a receiver.
type Publisher interface {
	// Publish sends msgs and returns one reply per message, in the order
	// of msgs. An error means the transport failed and nothing can be
	// assumed about any of the messages; the Relay sends them again.
	// Publish may be called from several goroutines at once.
	Publish(ctx context.Context, msgs []Message) ([]postbox.Reply, error)
}

// Store is an outbox as the Relay sees it.
type Store interface {
	// Due returns up to limit pending rows after seq whose next attempt is
	// due at now, in Seq order. The Relay never has one event in flight
	// twice; a store that several relays share (the transactional outbox)
	// must also keep relays apart, for example by claiming the rows it
	// returns with a lease (FOR UPDATE SKIP LOCKED, then a next attempt
	// time in the future) that Settle ends.
	Due(ctx context.Context, now time.Time, after int64, limit int) ([]Message, error)
	// Settle records the outcomes of one publish in one transaction.
	Settle(ctx context.Context, outcomes []Outcome) error
}

// Notifier is implemented by a Store that can tell the Relay about new
// rows, so they are sent at once instead of at the next poll.
type Notifier interface {
	Notify() <-chan struct{}
}

// Outcome is what happened to one message.
type Outcome struct {
	EventID string
	Kind    OutcomeKind
	Error   string    // the receiver's reason, or the transport error
	RetryAt time.Time // for Retry: when to send again
}

// OutcomeKind says how a Store must settle a row.
type OutcomeKind int

const (
	// Delivered: ACKed. The row leaves the outbox.
	Delivered OutcomeKind = iota
	// Rejected: refused with a non-retryable NACK. The row is kept as
	// rejected with Error until an operator requeues it.
	Rejected
	// Retry: refused with a retryable NACK. Count the attempt, record
	// Error, send again at RetryAt.
	Retry
	// Unanswered: sent, but the transport failed before a reply. Count the
	// attempt and record Error; the row stays due.
	Unanswered
)

// ReplyOutcome turns a receiver's reply into an Outcome.
func ReplyOutcome(r postbox.Reply, retryAt time.Time) Outcome {
	switch {
	case r.OK():
		return Outcome{EventID: r.EventID, Kind: Delivered}
	case r.Retryable:
		return Outcome{EventID: r.EventID, Kind: Retry, Error: string(r.Code) + ": " + r.Message, RetryAt: retryAt}
	default:
		return Outcome{EventID: r.EventID, Kind: Rejected, Error: string(r.Code) + ": " + r.Message}
	}
}
