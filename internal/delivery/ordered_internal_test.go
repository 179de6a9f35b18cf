package delivery

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/stream"
)

// TestOrderKey: each form of order_by finds its key in an event, and a
// key that is not there is the empty key.
func TestOrderKey(t *testing.T) {
	ev := &stream.StoredEvent{Event: stream.Event{
		Metadata: json.RawMessage(`{"device_id":"pi-7","session_id":"s-1","tenant":42,"headers":{"x-shopify-shop-domain":"shop-9"}}`),
		Payload:  json.RawMessage(`{"order":{"id":"o-1","n":7,"flag":true,"none":null},"a/b":"slash","items":[{"sku":"x"},{"sku":"y"}],"long":"` + strings.Repeat("z", 300) + `"}`),
	}}
	for _, c := range []struct{ by, want string }{
		{"device_id", "pi-7"},
		{"session_id", "s-1"},
		{"metadata.tenant", "42"},
		{"metadata.missing", ""},
		{"header.X-Shopify-Shop-Domain", "shop-9"},
		{"header.x-request-id", ""},
		{"/order/id", "o-1"},
		{"/order/n", "7"},
		{"/order/flag", "true"},
		{"/order/none", ""},
		{"/order", `{"id":"o-1","n":7,"flag":true,"none":null}`},
		{"/a~1b", "slash"},
		{"/items/1/sku", "y"},
		{"/items/2/sku", ""},
		{"/items/01/sku", ""},
		{"/nothing/here", ""},
	} {
		s := Subscription{OrderBy: c.by}
		if err := validOrderBy(c.by); err != nil {
			t.Fatalf("order_by %q: %v", c.by, err)
		}
		if got := s.orderKey(ev); got != c.want {
			t.Errorf("order_by %q: key %q, want %q", c.by, got, c.want)
		}
	}
	long := (&Subscription{OrderBy: "/long"}).orderKey(ev).(string)
	if !strings.HasPrefix(long, orderKeyDigestLabel) || len(long) != len(orderKeyDigestLabel)+64 {
		t.Errorf("a 300-byte key is stored as %q, want its digest", long)
	}
	if got := (&Subscription{}).orderKey(ev); got != nil {
		t.Errorf("an unordered subscription's key is %v, want none", got)
	}
}
