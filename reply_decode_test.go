package postbox_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
)

func TestDecodeRepliesMatchesEncodingJSON(t *testing.T) {
	replies := []postbox.Reply{
		postbox.Ack("evt_1", time.Date(2026, 2, 16, 23, 10, 22, 123456000, time.UTC), false),
		postbox.Ack("evt_\"2\"\\é", time.Now(), true),
		postbox.Nack("evt_3", &postbox.FieldError{Field: "ts", Code: postbox.CodeInvalidField, Message: "ts: \"nope\" is not\n RFC 3339"}),
		postbox.Nack("", &postbox.FieldError{Code: postbox.CodeInvalidJSON, Message: "frame"}),
		{EventID: "e", Status: postbox.StatusNack, Code: postbox.CodeUnavailable, Message: "later", Retryable: true},
	}
	for _, frame := range [][]byte{mustJSON(replies), mustJSON(replies[0]), []byte(` [ ] `),
		[]byte(`{"event_id":"x","status":"stored","new_field":{"a":[1,2]},"duplicate":true}`)} {
		var want []postbox.Reply
		if frame[0] == '{' {
			want = make([]postbox.Reply, 1)
			json.Unmarshal(frame, &want[0])
		} else {
			json.Unmarshal(frame, &want)
		}
		got, err := postbox.DecodeReplies(frame)
		if err != nil || !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Errorf("%s:\n got %+v %v\nwant %+v", frame, got, err, want)
		}
	}
	for _, bad := range []string{``, `[`, `{"event_id":1}`, `[{"status":"stored"},]`, `{"duplicate":"yes"}`, `nope`} {
		if _, err := postbox.DecodeReplies([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzDecodeReplies(f *testing.F) {
	f.Add(mustJSON([]postbox.Reply{postbox.Ack("a", time.Now(), true), postbox.Nack("b", &postbox.FieldError{Code: postbox.CodeConflict, Field: "payload", Message: "m"})}))
	f.Add([]byte(`{"event_id":"\u00e9\ud83d\ude00","status":"stored"}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		got, err := postbox.DecodeReplies(frame)
		if err != nil {
			return
		}
		var want []postbox.Reply
		var jerr error
		if i := firstByte(frame); i == '[' {
			jerr = json.Unmarshal(frame, &want)
		} else {
			want = make([]postbox.Reply, 1)
			jerr = json.Unmarshal(frame, &want[0])
		}
		if jerr != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", frame, jerr)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d replies, encoding/json %d", frame, len(got), len(want))
		}
		for k := range got {
			if got[k].EventID != want[k].EventID || got[k].Status != want[k].Status || got[k].Duplicate != want[k].Duplicate {
				t.Fatalf("%q: got %+v want %+v", frame, got[k], want[k])
			}
		}
	})
}

func firstByte(b []byte) byte {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return c
		}
	}
	return 0
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
