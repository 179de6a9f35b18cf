package feed_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/stream"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// TestLineGolden: the lines of an event with one-line documents, one with
// a pretty-printed payload, and a heartbeat, as testdata/lines.ndjson has
// them; each parses back to the same event, documents byte for byte.
func TestLineGolden(t *testing.T) {
	seq := int64(7)
	at := time.Date(2026, 3, 4, 5, 6, 7, 890000000, time.UTC)
	events := []stream.StoredEvent{
		{Event: stream.Event{NativeID: "evt_01", Variant: "pi-7", Type: "sensor.reading", OccurredAt: at, Sequence: &seq,
			Metadata: json.RawMessage(`{"device_id":"pi-7","session_id":"s1"}`), Payload: json.RawMessage(`{"t": 21.5, "html": "<b>&</b>"}`)},
			Offset: 1, ID: "devices/1", StreamID: "devices", SourceID: "devices", StoredAt: at.Add(time.Second)},
		{Event: stream.Event{NativeID: "hook-2", Type: "invoice.paid", OccurredAt: at,
			Metadata: json.RawMessage(`{}`), Payload: json.RawMessage("{\n  \"id\": \"in_1\"\r\n}")},
			Offset: 2, ID: "webhooks/2", StreamID: "webhooks", SourceID: "webhooks", StoredAt: at},
	}
	var got []byte
	for i := range events {
		got = feed.AppendEvent(got, &events[i])
	}
	got = feed.AppendHeartbeat(got, feed.Heartbeat{HighWatermark: 2, At: at})
	golden := filepath.Join("testdata", "lines.ndjson")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("lines differ from %s (go test -update rewrites it):\ngot\n%s\nwant\n%s", golden, got, want)
	}
	lines := bytes.Split(bytes.TrimSuffix(got, []byte("\n")), []byte("\n"))
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3", len(lines))
	}
	for i, e := range events {
		l, err := feed.ParseLine(lines[i])
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		ev := l.Event()
		if l.Offset != e.Offset || l.ID != e.ID || ev.NativeID != e.NativeID || ev.Variant != e.Variant || ev.Type != e.Type ||
			!ev.OccurredAt.Equal(e.OccurredAt) || !l.StoredAt.Equal(e.StoredAt) ||
			!bytes.Equal(ev.Payload, e.Payload) || !bytes.Equal(ev.Metadata, e.Metadata) || (ev.Sequence == nil) != (e.Sequence == nil) {
			t.Errorf("line %d parses to %+v, want %+v", i, ev, e.Event)
		}
	}
	hb, err := feed.ParseLine(lines[2])
	if err != nil || hb.Heartbeat == nil || hb.Heartbeat.HighWatermark != 2 || !hb.Heartbeat.At.Equal(at) {
		t.Errorf("heartbeat parses to %+v, %v", hb, err)
	}
}

// TestParseLineRefuses: lines that are no event name what is missing.
func TestParseLineRefuses(t *testing.T) {
	for _, line := range []string{`{`, `[]`, `{"native_id":"a","type":"t","payload":{}}`, `{"offset":1,"type":"t","payload":{}}`,
		`{"offset":1,"native_id":"a","payload":{}}`, `{"offset":1,"native_id":"a","type":"t"}`} {
		if _, err := feed.ParseLine([]byte(line)); err == nil {
			t.Errorf("ParseLine(%s) took it", line)
		}
	}
	if l, err := feed.ParseLine(nil); err != nil || l.Heartbeat == nil {
		t.Errorf("an empty line: %+v %v, want a heartbeat", l, err)
	}
}

// FuzzLineRoundTrip: any JSON object stored as a payload or metadata
// comes back from its line byte for byte, and the line is one line.
func FuzzLineRoundTrip(f *testing.F) {
	f.Add(`{"a":1}`, `{}`, "evt_1", "pi-1")
	f.Add("{\n \"a\" :\t[1, 2]\r\n}", `{"x":"<&>"}`, "é", "")
	f.Add(`{"s":"\u2028\n"}`, " {} ", "a\nb", "\x00")
	f.Add("{\"s\":\"\xff\"}\n", "{\"\xc3\":1}", "x", "y")
	f.Fuzz(func(t *testing.T, payload, metadata, nativeID, variant string) {
		var obj map[string]any
		if json.Unmarshal([]byte(payload), &obj) != nil || obj == nil || json.Unmarshal([]byte(metadata), &obj) != nil || obj == nil ||
			nativeID == "" || !utf8.ValidString(nativeID) || !utf8.ValidString(variant) {
			return // streams store JSON objects, under a native id of text
		}
		e := stream.StoredEvent{Event: stream.Event{NativeID: nativeID, Variant: variant, Type: "t",
			Payload: json.RawMessage(payload), Metadata: json.RawMessage(metadata)}, Offset: 9, ID: "s/9"}
		line := feed.AppendEvent(nil, &e)
		if i := bytes.IndexByte(line, '\n'); i != len(line)-1 {
			t.Fatalf("a line break at %d of %q", i, line)
		}
		l, err := feed.ParseLine(line[:len(line)-1])
		if err != nil {
			t.Fatalf("ParseLine(%q): %v", line, err)
		}
		ev := l.Event()
		if string(ev.Payload) != payload || string(ev.Metadata) != metadata || l.Offset != 9 {
			t.Fatalf("round trip of %q: payload %q metadata %q offset %d", line, ev.Payload, ev.Metadata, l.Offset)
		}
		if ev.NativeID != nativeID || ev.Variant != variant {
			t.Fatalf("identity (%q, %q) came back as (%q, %q)", nativeID, variant, ev.NativeID, ev.Variant)
		}
	})
}

// TestLineNotUTF8: a payload or metadata on one line that is not UTF-8
// goes as base64, so that the line stays JSON text, and reads back byte
// for byte.
func TestLineNotUTF8(t *testing.T) {
	e := stream.StoredEvent{Event: stream.Event{NativeID: "k", Type: "t", Metadata: json.RawMessage("{\"h\":\"\xfe\"}"),
		Payload: json.RawMessage("{\"a\":\"\xff\"}")}, Offset: 1, ID: "webhooks/1", StoredAt: time.Unix(1, 0)}
	line := bytes.TrimSuffix(feed.AppendEvent(nil, &e), []byte("\n"))
	if !utf8.Valid(line) || !json.Valid(line) || !bytes.Contains(line, []byte(`"payload_base64"`)) || !bytes.Contains(line, []byte(`"metadata_base64"`)) {
		t.Fatalf("line %q: want UTF-8 JSON with payload_base64 and metadata_base64", line)
	}
	l, err := feed.ParseLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if ev := l.Event(); !bytes.Equal(ev.Payload, e.Payload) || !bytes.Equal(ev.Metadata, e.Metadata) {
		t.Fatalf("read back payload %q metadata %q, want %q %q", ev.Payload, ev.Metadata, e.Payload, e.Metadata)
	}
}
