package stream_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/postbox-events/postbox/stream"
)

// TestStartJSON: a Start is stored as the JSON that JetStream's consumer
// records and Kafka's commit metadata have always held, canonical, and
// reads back the same.
func TestStartJSON(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 5, time.FixedZone("CET", 3600))
	for _, c := range []struct {
		start stream.Start
		json  string
	}{
		{stream.Start{}, `{"policy":"latest"}`},
		{stream.Start{Policy: stream.StartEarliest, Offset: 9}, `{"policy":"earliest"}`},
		{stream.Start{Policy: stream.StartAtOffset, Offset: 5}, `{"policy":"at_offset","offset":5}`},
		{stream.Start{Policy: stream.StartAtTime, Time: at}, `{"policy":"at_time","time":"2026-11-24T09:00:00.000000005Z"}`},
	} {
		b, err := json.Marshal(c.start)
		if err != nil || string(b) != c.json {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", c.start, b, err, c.json)
		}
		var back stream.Start
		if err := json.Unmarshal(b, &back); err != nil || back != c.start.Canonical() {
			t.Errorf("Unmarshal(%s) = %+v, %v; want %+v", b, back, err, c.start.Canonical())
		}
	}
}

// TestLagOf: the events from a reader's next offset to the high
// watermark, none when it is past it or the stream is empty.
func TestLagOf(t *testing.T) {
	for _, c := range []struct {
		next, hw, want int64
	}{
		{1, 0, 0},   // an empty stream
		{1, 1, 1},   // one event, unread
		{2, 1, 0},   // read to the end
		{1, 10, 10}, // nothing read
		{4, 10, 7},
		{11, 10, 0},
		{20, 10, 0}, // past the end (the stream was trimmed)
	} {
		if got := stream.LagOf(c.next, c.hw); got != c.want {
			t.Errorf("LagOf(%d, %d) = %d, want %d", c.next, c.hw, got, c.want)
		}
	}
}
