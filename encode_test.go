package postbox_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/postbox-events/postbox"
)

// AppendJSON writes what json.Marshal writes, but for the payload, which
// it compacts as json.Compact does (no escapes added); it fails where
// json.Marshal fails and on text that is not valid UTF-8, which
// json.Marshal would repair.
func FuzzAppendJSON(f *testing.F) {
	for _, c := range []struct {
		id, typ, trace, payload string
		seq                     int64
	}{
		{"evt_1", "order.created", "", `{"a":1}`, -1},
		{"evt_2", "t", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ` { "a" : [1, 2, "x y"] } `, 7},
		{"evt_<3>", "a&b", "", `{"html":"<b>&amp;</b>"}`, 0},
		{"evt_4", "t", "", `{"sep":"\u2028"}`, -1},
		{"evt_5", "t", "", "{\"raw\":\"\xe2\x80\xa8\"}", -1},
		{"evt_6", "t", "", `{"a":}`, -1},
		{"evt_7", "t", "", ``, -1},
		{"evt_8", "t", "", `null`, -1},
		{"evt_9", "tab\t", "", `"just a string"`, -1},
		{"evt_10", "t", "", `{"a":1} {"b":2}`, -1},
		{"evt_11", "t", "", "{\"bad\":\"\xff\"}", -1},
		{"evt_\xff", "t", "", `{}`, -1},
	} {
		f.Add(c.id, c.typ, c.trace, c.payload, c.seq)
	}
	f.Fuzz(func(t *testing.T, id, typ, trace, payload string, seq int64) {
		env := postbox.Envelope{SchemaVersion: postbox.SchemaVersion, EventID: id, Type: typ, TS: "2026-11-24T19:00:00.123456789Z",
			SessionID: "sess", DeviceID: "dev", TraceParent: trace, TraceState: trace, Payload: json.RawMessage(payload)}
		if seq >= 0 {
			env.Seq = &seq
		}
		got, err := env.AppendJSON([]byte("x"))
		if !utf8.ValidString(id) || !utf8.ValidString(typ) || !utf8.ValidString(trace) || !utf8.ValidString(payload) {
			if err == nil {
				t.Fatalf("AppendJSON of text that is not UTF-8 = %s, want an error", got[1:])
			}
			return
		}
		_, wantErr := json.Marshal(env)
		if payload == "" {
			wantErr = errors.New("payload: required") // json.Marshal writes null for a nil payload
		}
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("AppendJSON error %v, json.Marshal error %v", err, wantErr)
		}
		if err != nil {
			return
		}
		// json.Marshal of the envelope with a stand-in payload, then the
		// payload as json.Compact writes it.
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(payload)); err != nil {
			t.Fatal(err)
		}
		env.Payload = json.RawMessage("0")
		head, _ := json.Marshal(env)
		want := strings.TrimSuffix(string(head), "0}") + compact.String() + "}"
		if string(got) != "x"+want {
			t.Fatalf("AppendJSON = %s\nwant %s", got[1:], want)
		}
	})
}

func BenchmarkAppendJSON(b *testing.B) {
	seq := int64(42)
	env := postbox.Envelope{SchemaVersion: postbox.SchemaVersion, EventID: "evt_01JDX3T2ZKQ8M7W4V5N6P9R0S1", Type: "proposal.task",
		TS: "2026-11-24T19:00:00.123456789Z", SessionID: "sess_bench", DeviceID: "outbox", Seq: &seq,
		Payload: json.RawMessage(`{"intent":"server.log_summary","confidence":0.84,"user_text":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)}
	b.Run("AppendJSON", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf, _ = env.AppendJSON(buf[:0])
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			json.Marshal(env)
		}
	})
}

// Valid answers as json.Valid.
func FuzzValid(f *testing.F) {
	for _, s := range []string{``, ` `, `{}`, ` {"a":[1,2.5e3,-0,"x\u00e9"]} `, `{"a":}`, `[1,]`, `01`, `"\x"`, "\"\xff\"", `nul`, `{"a":1}{}`, `[[[[[]]]]]`, `1 2`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := postbox.Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid %v", s, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	p := []byte(`{"intent":"server.log_summary","confidence":0.84,"user_text":"` + strings.Repeat("x", 240) + `"}`)
	b.Run("Valid", func(b *testing.B) {
		for b.Loop() {
			postbox.Valid(p)
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		for b.Loop() {
			json.Valid(p)
		}
	})
}
