package schedule_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/schedule"
)

// TestParse: a time or a delay, one at most; a past time is kept (due at
// once); what does not parse, a negative delay, both, and more than Max
// ahead are refused naming the field.
func TestParse(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at, delay string
		want      time.Time
		field     string // refused naming it
	}{
		{},
		{at: "2026-11-29T15:00:00+02:00", want: time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)},
		{at: "2020-01-01T00:00:00Z", want: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)},
		{delay: "90s", want: now.Add(90 * time.Second)},
		{delay: "0s", want: now},
		{delay: "8760h", want: now.Add(schedule.Max)},
		{delay: "8761h", field: "delay"},
		{delay: "-1s", field: "delay"},
		{delay: "soon", field: "delay"},
		{at: "tomorrow", field: "at"},
		{at: now.Add(schedule.Max + time.Second).Format(time.RFC3339), field: "at"},
		{at: "2026-12-01T00:00:00Z", delay: "1h", field: "at"},
	} {
		got, err := schedule.Parse(c.at, c.delay, now, "at", "delay")
		var fe *schedule.FieldError
		switch {
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Errorf("Parse(%q, %q): %v, want an error naming %s", c.at, c.delay, err, c.field)
		case c.field == "" && (err != nil || !got.Equal(c.want)):
			t.Errorf("Parse(%q, %q): %v, %v; want %v", c.at, c.delay, got, err, c.want)
		}
	}
}

// TestOf: the delivery time of metadata is its top-level deliver_at when
// that is an RFC 3339 time; none otherwise.
func TestOf(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 123000, time.UTC)
	for meta, want := range map[string]time.Time{
		`{"device_id":"pi","deliver_at":"` + schedule.Format(at) + `"}`: at,
		`{"deliver_at":"2026-12-01T10:00:00.000123+01:00"}`:             at,
		`{"device_id":"pi"}`: {},
		`{"headers":{"deliver_at":"2026-12-01T09:00:00Z"}}`: {},
		`{"deliver_at":"soon"}`:                             {},
		`{"deliver_at":42}`:                                 {},
		`not json "deliver_at"`:                             {},
	} {
		got, ok := schedule.Of(json.RawMessage(meta))
		if ok != !want.IsZero() || !got.Equal(want) {
			t.Errorf("Of(%s): %v, %v; want %v", meta, got, ok, want)
		}
	}
}
