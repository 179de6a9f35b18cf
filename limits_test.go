package postbox_test

import (
	"strings"
	"testing"

	"github.com/postbox-events/postbox"
)

// TestCheckEvent: the limits every intake path stores an event under:
// what a WebSocket envelope or a webhook would be refused for is refused
// here too, naming the field.
func TestCheckEvent(t *testing.T) {
	deep := []byte(`{"a":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`)
	ok := []byte(`{"a":1}`)
	var lim postbox.Limits
	for _, c := range []struct {
		id, variant, typ string
		payload, meta    []byte
		want             string // "" for none
	}{
		{"evt_1", "", "push", ok, nil, ""},
		{strings.Repeat("k", 255), strings.Repeat("v", 255), strings.Repeat("t", 128), ok, ok, ""},
		{strings.Repeat("k", 10000), "", "push", ok, nil, "id: 10000 bytes, over the limit of 255"},
		{"", "", "push", ok, nil, "id: required"},
		{"a\x00b", "", "push", ok, nil, "id: contains a control character"},
		{"evt_1", strings.Repeat("v", 5000), "push", ok, nil, "variant: 5000 bytes, over the limit of 255"},
		{"evt_1", "", strings.Repeat("t", 10000), ok, nil, "type: 10000 bytes, over the limit of 128"},
		{"evt_1", "", "\xff", ok, nil, "type: not valid UTF-8"},
		{"evt_1", "", "push", deep, nil, "payload: arrays and objects nested 5001 deep, at most 1000"},
		{"evt_1", "", "push", ok, deep, "metadata: arrays and objects nested 5001 deep, at most 1000"},
	} {
		fe := lim.CheckEvent(c.id, c.variant, c.typ, c.payload, c.meta)
		switch {
		case c.want == "" && fe != nil:
			t.Errorf("%.20q %.20q: refused: %v", c.id, c.typ, fe)
		case c.want != "" && (fe == nil || fe.Message != c.want):
			t.Errorf("%.20q %.20q: %v, want %q", c.id, c.typ, fe, c.want)
		}
	}
	// A larger MaxIDBytes takes ids an envelope could carry.
	if fe := (postbox.Limits{MaxIDBytes: 300}).CheckEvent(strings.Repeat("k", 300), "", "t", ok, nil); fe != nil {
		t.Errorf("MaxIDBytes 300: %v", fe)
	}
}
