package client

import (
	"context"
	"net/http"

	"github.com/postbox-events/postbox/api"
)

// PauseSubscription pauses the delivery of a subscription: none of its
// items is leased, by the server's workers or by a runtime, until
// ResumeSubscription; its inbox keeps filling. reason may be "".
func (c *API) PauseSubscription(ctx context.Context, subscription, reason string) (api.Subscription, error) {
	var out api.Subscription
	return out, c.send(ctx, http.MethodPost, "/v1/subscriptions/"+name(subscription)+"/pause", api.PauseSubscription{Reason: reason}, &out)
}

// ResumeSubscription resumes the delivery of a paused subscription.
func (c *API) ResumeSubscription(ctx context.Context, subscription string) (api.Subscription, error) {
	var out api.Subscription
	return out, c.send(ctx, http.MethodPost, "/v1/subscriptions/"+name(subscription)+"/resume", nil, &out)
}

// TestSubscription sends a postbox.test event to the endpoint of a
// subscription and returns what the endpoint answered.
func (c *API) TestSubscription(ctx context.Context, subscription string) (api.TestDelivery, error) {
	var out api.TestDelivery
	return out, c.send(ctx, http.MethodPost, "/v1/subscriptions/"+name(subscription)+"/test", nil, &out)
}

// CancelItem moves a pending item to failed (a dead letter, which can be
// replayed), recording reason (may be "").
func (c *API) CancelItem(ctx context.Context, inbox string, id int64, reason string) (api.Item, error) {
	var out api.Item
	return out, c.send(ctx, http.MethodPost, itemPath(inbox, id)+"/cancel",
		api.CancelItem{Reason: reason}, &out)
}

// DiscardItem deletes an item that is not processing, for good, and
// returns it as it was.
func (c *API) DiscardItem(ctx context.Context, inbox string, id int64) (api.Item, error) {
	var out api.Item
	return out, c.send(ctx, http.MethodPost, itemPath(inbox, id)+"/discard", nil, &out)
}

// DiscardDeadLetters deletes every dead letter sel names, for good.
func (c *API) DiscardDeadLetters(ctx context.Context, sel api.DiscardDeadLetters) (api.Discarded, error) {
	var out api.Discarded
	return out, c.send(ctx, http.MethodPost, "/v1/dead-letters/discard", sel, &out)
}
