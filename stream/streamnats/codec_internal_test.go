package streamnats

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/postbox-events/postbox/stream"
)

// TestHeaderRoundTrip checks that every field of an event, whatever bytes
// it holds, comes back from the one header, and that the header stays one
// line that NATS's framing keeps as it is.
func TestHeaderRoundTrip(t *testing.T) {
	seq := int64(-42)
	occurred := time.Date(2026, 2, 28, 23, 59, 59, 1, time.FixedZone("x", 3600))
	evs := []stream.Event{
		{NativeID: "ord-1", Type: "order.created", Payload: json.RawMessage(`{}`)},
		{
			NativeID: " a;b=c%d\r\n\x00\x7f ", Variant: "v;1 ", Type: "t=1;x",
			OccurredAt: occurred, Sequence: &seq,
			Metadata:       json.RawMessage(`{"k":"a;b%c","n":"é"}`),
			DeliveryHandle: json.RawMessage(`{"h":" ; "}`),
			Payload:        json.RawMessage(`{"p":1}`),
		},
	}
	stored := time.Date(2026, 11, 24, 8, 10, 49, 123456789, time.UTC)
	stamp := string(appendTime(nil, stored))
	for _, ev := range evs {
		m := message("S.x", &ev, stamp)
		if len(m.Header) != 2 {
			t.Fatalf("%d headers, want 2: %v", len(m.Header), m.Header)
		}
		h := m.Header.Get(HeaderEvent)
		if strings.ContainsAny(h, "\r\n\x00") || strings.TrimSpace(h) != h {
			t.Fatalf("header %q is not safe for NATS", h)
		}
		if !strings.HasPrefix(h, "at="+stamp+";") {
			t.Fatalf("header %q does not begin with the stored time", h)
		}
		var e stream.StoredEvent
		if err := decode(&e, m.Header, m.Data, map[string]string{}); err != nil {
			t.Fatal(err)
		}
		if e.NativeID != ev.NativeID || e.Variant != ev.Variant || e.Type != ev.Type || string(e.Payload) != string(ev.Payload) {
			t.Fatalf("decoded %+v from %q, want %+v", e.Event, h, ev)
		}
		if !e.OccurredAt.Equal(ev.OccurredAt) || !e.StoredAt.Equal(stored) || !storedAt(m.Header, time.Time{}).Equal(stored) {
			t.Fatalf("times %v, %v from %q", e.OccurredAt, e.StoredAt, h)
		}
		if (ev.Sequence == nil) != (e.Sequence == nil) || ev.Sequence != nil && *e.Sequence != *ev.Sequence {
			t.Fatalf("sequence %v, want %v", e.Sequence, ev.Sequence)
		}
		wantMeta := string(ev.Metadata)
		if wantMeta == "" {
			wantMeta = "{}"
		}
		if string(e.Metadata) != wantMeta || string(e.DeliveryHandle) != string(ev.DeliveryHandle) {
			t.Fatalf("metadata %s, handle %s from %q", e.Metadata, e.DeliveryHandle, h)
		}
	}
	var e stream.StoredEvent
	if err := decode(&e, nats.Header{}, nil, nil); err == nil {
		t.Fatal("a message without the header decoded")
	}
}

func TestParseTime(t *testing.T) {
	for _, s := range []string{"2026-11-24T08:10:49.123456789Z", "2024-02-29T00:00:00.000000000Z", "2026-11-24T09:10:49.5+01:00"} {
		want, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseTime(s)
		if err != nil || !got.Equal(want) {
			t.Fatalf("parseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"2026-02-31T00:00:00.000000000Z", "2026-1x-24T08:10:49.123456789Z", ""} {
		if got, err := parseTime(s); err == nil {
			t.Fatalf("parseTime(%q) = %v, want an error", s, got)
		}
	}
}

func TestAckInfo(t *testing.T) {
	for _, c := range []struct {
		reply string
		seq   uint64
		ts    int64
		ok    bool
	}{
		{"$JS.ACK.S.C.1.42.7.1700000000000000001.3", 42, 1700000000000000001, true},
		{"$JS.ACK.dom.ACCHASH.S.C.1.43.7.1700000000000000002.3.rnd", 43, 1700000000000000002, true},
		{"$JS.ACK._.ACCHASH.S.C.1.44.7.1700000000000000003.3", 44, 1700000000000000003, true},
		{"$JS.ACK.S.C.1.x.7.1.3", 0, 0, false},
		{"_INBOX.abc", 0, 0, false},
		{"$JS.ACK.S.C.1", 0, 0, false},
	} {
		seq, ts, ok := ackInfo(c.reply)
		if seq != c.seq || ts != c.ts || ok != c.ok {
			t.Errorf("ackInfo(%q) = %d, %d, %v; want %d, %d, %v", c.reply, seq, ts, ok, c.seq, c.ts, c.ok)
		}
	}
}

// TestAppendTime checks the digit-by-digit format against time's own.
func TestAppendTime(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 11, 29, 10, 9, 8, 7, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Now(),
	} {
		if got, want := string(appendTime(nil, tm)), tm.UTC().Format(timeLayout); got != want {
			t.Errorf("appendTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

// TestIdentityToken pins the subject token of an identity: a stored
// event's subject must not change from one version to the next.
func TestIdentityToken(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, c := range []struct{ id, variant, want string }{
		{"ord-1", "", "d7ab8d8550f721f41bbbd844aa1435d8"},
		{"ord-1", "v-2", "d7af4d3c6ed61e412e3745b0e90c5258"},
	} {
		if got := identityToken(c.id, c.variant); got != c.want {
			t.Errorf("identityToken(%q, %q) = %s, want %s", c.id, c.variant, got, c.want)
		}
		if got := identitySubject("S.", c.id, c.variant); got != "S."+c.want {
			t.Errorf("identitySubject = %s", got)
		}
	}
	if a, b := identityToken(long, ""), identityToken(long+"y", ""); len(a) != 32 || a == b {
		t.Errorf("long ids: %s, %s", a, b)
	}
}
