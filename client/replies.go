package client

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/postbox-events/postbox/api"
)

// Reply asks postbox to send body, JSON, to the url of the delivery
// handle of item id's event (a GitHub issue's comments, a Stripe object,
// a webhook's reply-to), with the source's reply settings, retrying it as
// it retries deliveries. The reply is stored once per key (empty: a
// digest of body): asking again with the same key and body returns the
// reply as it is, and with another body is a conflict (an *Error with
// api.CodeConflict). An item whose handle names no url (a device's, a
// CloudEvent's) is refused with api.CodeInvalidField.
func (c *API) Reply(ctx context.Context, inbox string, id int64, key string, body json.RawMessage) (api.Reply, error) {
	var out api.Reply
	return out, c.send(ctx, http.MethodPost, itemPath(inbox, id)+"/reply", api.ReplyRequest{Key: key, Body: body}, &out)
}

// Replies returns the replies to item id, oldest first, each with its
// state and attempt log.
func (c *API) Replies(ctx context.Context, inbox string, id int64) ([]api.Reply, error) {
	var out api.ReplyList
	return out.Replies, c.get(ctx, itemPath(inbox, id)+"/replies", &out)
}

// RetryReply sends a failed reply (a dead letter) again.
func (c *API) RetryReply(ctx context.Context, inbox string, id int64, key string) (api.Reply, error) {
	var out api.Reply
	return out, c.send(ctx, http.MethodPost, itemPath(inbox, id)+"/replies/"+name(key)+"/retry", nil, &out)
}

// itemPath is the path of item id of inbox.
func itemPath(inbox string, id int64) string {
	return "/v1/inboxes/" + name(inbox) + "/items/" + strconv.FormatInt(id, 10)
}
