package api_test

import (
	"encoding/json"
	"testing"

	"github.com/postbox-events/postbox/api"
)

func TestParseDeliveryHandle(t *testing.T) {
	h, ok, err := api.ParseDeliveryHandle(json.RawMessage(`{"kind":"github","repository":"o/r","issue":1,"url":"https://api.github.com/repos/o/r/issues/1/comments"}`))
	if err != nil || !ok || h.Kind != api.HandleGitHub || h.URL != "https://api.github.com/repos/o/r/issues/1/comments" {
		t.Fatalf("%+v %v %v", h, ok, err)
	}
	for _, raw := range []string{``, `null`, ` null `} {
		if h, ok, err := api.ParseDeliveryHandle(json.RawMessage(raw)); ok || err != nil || h != (api.DeliveryHandle{}) {
			t.Errorf("%q: %+v %v %v, want none", raw, h, ok, err)
		}
	}
	if _, _, err := api.ParseDeliveryHandle(json.RawMessage(`[1]`)); err == nil {
		t.Error("an array: no error")
	}
}
