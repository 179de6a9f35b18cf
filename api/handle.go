package api

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// HeaderDeliveryHandle is the header a push carries its item's delivery
// handle in (Item.DeliveryHandle, compact JSON); the push of an item
// without one carries none.
const HeaderDeliveryHandle = "X-Postbox-Delivery-Handle"

// Kinds of delivery handle (DeliveryHandle.Kind).
const (
	HandleGitHub      = "github"      // an issue or pull request: repository, issue; url its comments endpoint
	HandleStripe      = "stripe"      // an object of Stripe's API: object, id; url the object
	HandleCloudEvents = "cloudevents" // source, subject; no url
	HandlePoll        = "poll"        // the members a poll source's handle setting reads
	HandleWebhook     = "webhook"     // a generic webhook source's handle_header or handle_pointer: url or target
	HandleDevice      = "device"      // device_id, session_id; postbox cannot reply to a device
)

// DeliveryHandle is what every delivery handle has (docs/API.md,
// Delivery handles): where its event came from, captured at intake, and
// where a reply goes. Its other members, which vary by kind, are in the
// item's or event's raw DeliveryHandle.
type DeliveryHandle struct {
	Kind string `json:"kind"`          // HandleGitHub, HandleStripe, ...
	URL  string `json:"url,omitempty"` // an absolute http(s) URL a reply goes to; "" when none
}

// ParseDeliveryHandle decodes an Item's or Event's DeliveryHandle; ok is
// false when it is null (the event has none).
func ParseDeliveryHandle(raw json.RawMessage) (h DeliveryHandle, ok bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return h, false, nil
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return h, false, fmt.Errorf("delivery handle: %w", err)
	}
	return h, true, nil
}
