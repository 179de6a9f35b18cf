package server

import (
	"context"
	"encoding/json"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/stream"
)

// What the handlers of the operator API use of delivery, one small
// interface per handler group, as nats.go composes its JetStream of
// StreamManager, Publisher and the others. *delivery.Delivery implements
// every one; a test gives a handler group a fake of the roles it uses
// instead (roles_internal_test.go). Errors are delivery's: ErrNotFound,
// ErrConflict, ErrInvalid, ErrInvalidState and ErrLeaseLost, which
// writeErr maps to their statuses.

// subscriptions is what the subscription handlers (api.go, endpoints.go),
// the consumers' (consumers.go) and the stats' lags (stats.go) use.
type subscriptions interface {
	// Create creates s, or returns the subscription of that name and
	// false when it has the same definition; ErrConflict when its
	// definition differs, ErrNotFound for an unknown source.
	Create(ctx context.Context, s delivery.Subscription) (_ delivery.Subscription, created bool, _ error)
	// Subscription returns the subscription name, or ErrNotFound.
	Subscription(ctx context.Context, name string) (delivery.Subscription, error)
	// Subscriptions returns every subscription.
	Subscriptions(ctx context.Context) ([]delivery.Subscription, error)
	// Update changes a subscription's target and endpoint settings.
	Update(ctx context.Context, name string, c delivery.Change) (delivery.Subscription, error)
	// Delete deletes the subscription name, or returns ErrNotFound.
	Delete(ctx context.Context, name string) error
	// Lag returns the subscription's read position against its stream.
	Lag(ctx context.Context, name string) (stream.Lag, error)
	// SubscriptionCounts returns the item counts of every subscription
	// that has items, by uid.
	SubscriptionCounts(ctx context.Context) (map[string]delivery.InboxCounts, error)
	// Held reports what holds back the keys of an ordered subscription.
	Held(ctx context.Context, s delivery.Subscription) (delivery.Held, error)
	// Breaker returns the state of the breaker of inbox's endpoint.
	Breaker(ctx context.Context, inbox string) (delivery.Breaker, error)
	// Enable closes the breaker of the subscription's endpoint.
	Enable(ctx context.Context, name string) (delivery.Breaker, error)
}

// inboxes is what the inbox handlers (api.go, endpoints.go) use: counts,
// items and their attempts, and the lease, ack, nack and extend of the
// runtimes' protocol.
type inboxes interface {
	// Inboxes returns the items of every inbox counted by state.
	Inboxes(ctx context.Context) ([]delivery.InboxCounts, error)
	// List returns a page of inbox's items in state ("" any) after the
	// id after.
	List(ctx context.Context, inbox, state string, after int64, limit int) ([]delivery.Item, error)
	// Item returns the item id of inbox ("" any), or ErrNotFound.
	Item(ctx context.Context, inbox string, id int64) (delivery.Item, error)
	// Attempts returns the delivery attempts of an item to its endpoint.
	Attempts(ctx context.Context, inbox string, id int64) ([]delivery.Attempt, error)
	// Lease leases up to max pending items for visibility, waiting up to
	// wait for one.
	Lease(ctx context.Context, inbox string, max int, visibility, wait time.Duration) (delivery.Lease, error)
	// Ack, Nack and NackDead settle items under lease ("" an operator);
	// each item's result says whether it was settled.
	Ack(ctx context.Context, inbox string, ids []int64, lease string) ([]delivery.Result, error)
	Nack(ctx context.Context, inbox string, ids []int64, lease string, delay time.Duration, reason string) ([]delivery.Result, error)
	NackDead(ctx context.Context, inbox string, ids []int64, lease string, reason string) ([]delivery.Result, error)
	// Extend moves the lease of items to visibility from now.
	Extend(ctx context.Context, inbox string, ids []int64, lease string, visibility time.Duration) ([]delivery.Result, time.Time, error)
	// Reply stores a reply to an item under key, once; made says whether
	// this call made it. Replies lists an item's replies, and RetryReply
	// sends a failed one again.
	Reply(ctx context.Context, inbox string, id int64, key string, body json.RawMessage) (_ delivery.Reply, made bool, _ error)
	Replies(ctx context.Context, inbox string, id int64) ([]delivery.Reply, error)
	RetryReply(ctx context.Context, inbox string, id int64, key string) (delivery.Reply, error)
}

// deadLetters is what the dead-letter handlers (deadletters.go) use.
type deadLetters interface {
	// ListDeadLetters returns a page of the failed items f selects.
	ListDeadLetters(ctx context.Context, f delivery.DeadLetters) ([]delivery.Item, error)
	// Replay returns the failed items f selects to pending, and their ids.
	Replay(ctx context.Context, f delivery.DeadLetters) ([]int64, error)
	// Item returns the item id of inbox ("" any), or ErrNotFound.
	Item(ctx context.Context, inbox string, id int64) (delivery.Item, error)
}

// replayJobs is what the replay handlers (replays.go) use.
type replayJobs interface {
	// ReplayRange starts a job replaying a range of a subscription's
	// items; ErrConflict while another of its replays runs.
	ReplayRange(ctx context.Context, r delivery.ReplayRange) (delivery.ReplayJob, error)
	// ReplayJob returns the job id, or ErrNotFound.
	ReplayJob(ctx context.Context, id string) (delivery.ReplayJob, error)
	// ReplayJobs returns the jobs of subscription ("" every one), newest
	// first.
	ReplayJobs(ctx context.Context, subscription string) ([]delivery.ReplayJob, error)
}

// positions is what the consumer handlers (consumers.go) use besides
// subscriptions: moving a subscription's read position.
type positions interface {
	// Reset moves the read position of subscription name to start.
	Reset(ctx context.Context, name string, start stream.Start) (stream.Consumer, error)
}

// events is what the event handlers (events.go) and the webhook lookup
// (webhooks.go) use: an event's deliveries and the search of an inbox.
type events interface {
	// Deliveries returns what every subscription made of ev, an event
	// of streamID, deleted subscriptions' items included.
	Deliveries(ctx context.Context, streamID string, ev *stream.StoredEvent) ([]delivery.EventDelivery, error)
	// Search returns a page of the items of an inbox q selects, newest
	// first, and the Before of the next page (0: none).
	Search(ctx context.Context, q delivery.ItemQuery) ([]delivery.Item, int64, error)
}

// operations is what an operator's acts (operate.go) use.
type operations interface {
	// Pause and Resume pause and resume a subscription's delivery.
	Pause(ctx context.Context, name, reason string) (delivery.Subscription, error)
	Resume(ctx context.Context, name string) (delivery.Subscription, error)
	// SendTest sends a test event to a subscription's endpoint.
	SendTest(ctx context.Context, name string) (delivery.TestResult, error)
	// Cancel dead-letters a pending item; DiscardItem deletes an item
	// that is not processing; ErrInvalidState otherwise.
	Cancel(ctx context.Context, inbox string, id int64, reason string) (delivery.Item, error)
	DiscardItem(ctx context.Context, inbox string, id int64) (delivery.Item, error)
	// Discard deletes the failed items f selects, and returns their ids.
	Discard(ctx context.Context, f delivery.DeadLetters) ([]int64, error)
}

var (
	_ events        = (*delivery.Delivery)(nil)
	_ operations    = (*delivery.Delivery)(nil)
	_ subscriptions = (*delivery.Delivery)(nil)
	_ inboxes       = (*delivery.Delivery)(nil)
	_ deadLetters   = (*delivery.Delivery)(nil)
	_ replayJobs    = (*delivery.Delivery)(nil)
	_ positions     = (*delivery.Delivery)(nil)
)

// roles are the handlers' view of delivery, one field per handler group.
type roles struct {
	subs        subscriptions
	inboxes     inboxes
	deadLetters deadLetters
	replayJobs  replayJobs
	positions   positions
	events      events
	ops         operations
}

// rolesOf gives every handler group d.
func rolesOf(d *delivery.Delivery) roles {
	return roles{subs: d, inboxes: d, deadLetters: d, replayJobs: d, positions: d, events: d, ops: d}
}
