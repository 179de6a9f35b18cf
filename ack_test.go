package postbox_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
)

// TestReplyJSON: a reply is written as its struct tags say, empty fields
// left out, except that a NACK always carries "retryable", false too
// (docs/PROTOCOL.md shows it), and the bytes read back to the reply.
func TestReplyJSON(t *testing.T) {
	// shadow has Reply's fields and tags without its MarshalJSON.
	type shadow struct {
		EventID   string       `json:"event_id"`
		Status    string       `json:"status"`
		AckTS     string       `json:"ack_ts,omitempty"`
		Duplicate bool         `json:"duplicate,omitempty"`
		Code      postbox.Code `json:"code,omitempty"`
		Field     string       `json:"field,omitempty"`
		Message   string       `json:"message,omitempty"`
		Retryable bool         `json:"retryable,omitempty"`
	}
	at := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	for _, r := range []postbox.Reply{
		postbox.Ack("evt-1", at, false),
		postbox.Ack("evt-<2>&", at, true),
		postbox.Nack("evt-3", &postbox.FieldError{Field: "ts", Code: postbox.CodeInvalidField, Message: `ts: "yesterday" is not an RFC 3339 timestamp`}),
		postbox.Nack("", errors.New("store closed \u2028 \xff")),
		postbox.Nack("evt-5", &postbox.FieldError{Code: postbox.CodeOutage, Message: "the server is shutting down"}),
	} {
		got, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(shadow(r))
		if r.Status == postbox.StatusNack && !r.Retryable {
			want = append(want[:len(want)-1], `,"retryable":false}`...)
		}
		if string(got) != string(want) {
			t.Errorf("reply %+v\n got %s\nwant %s", r, got, want)
		}
		if r.Status == postbox.StatusNack && !strings.Contains(string(got), `"retryable":`) {
			t.Errorf("NACK %s has no retryable", got)
		}
		var back postbox.Reply
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		if r.Message == "store closed \u2028 \xff" { // json writes invalid UTF-8 as U+FFFD
			back.Message = r.Message
		}
		if back != r {
			t.Errorf("%s read back as %+v, want %+v", got, back, r)
		}
	}
}
