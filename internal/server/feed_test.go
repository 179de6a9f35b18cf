package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/stream"
)

// TestFeed: GET /v1/streams/{stream}/events on SQLite (a stream.Waiter
// and Scanner), on JetStream, and on a backend with neither (polled, read
// by offset through stream.ReadFrom's fallback).
func TestFeed(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testFeed(t, start(t, server.Config{}, nil)) })
	t.Run("nats", func(t *testing.T) { testFeed(t, startNATS(t, natstest.Start(t), "FEED_", server.Config{})) })
	t.Run("plain", func(t *testing.T) {
		ts, _ := startPlain(t, server.Config{})
		testFeed(t, ts)
	})
}

// feedEvents are stored in devices by testFeed: a pretty-printed payload
// (with a newline), characters JSON encoders like to escape, metadata, a
// sequence and a variant.
func feedEvents() []stream.Event {
	seq := int64(42)
	return []stream.Event{
		{NativeID: "evt_1", Variant: "pi-1", Type: "a.b", OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), Sequence: &seq,
			Metadata: json.RawMessage(`{"device_id":"pi-1"}`), Payload: json.RawMessage("{\n  \"x\" : 1,\n  \"html\": \"<a&b>\"\n}")},
		{NativeID: "evt_2", Type: "a.c", Payload: json.RawMessage(`{"y": [1, 2,  3]}`)},
		{NativeID: "evt_3", Variant: "pi-2", Type: "a.b", Payload: json.RawMessage(`{"\u00e9":"é"}`)},
		{NativeID: "evt_4", Type: "a.b", Payload: json.RawMessage(`{}`), Metadata: json.RawMessage("{\r\n}")},
		{NativeID: "evt_5", Type: "a.b", Payload: json.RawMessage(`{"n":5}`)},
	}
}

func testFeed(t *testing.T, ts *testServer) {
	ctx := testCtx(t, time.Minute)
	b := ts.Srv.Streams()
	if _, err := b.Append(ctx, server.DeviceSource, feedEvents()); err != nil {
		t.Fatal(err)
	}

	t.Run("after and limit", func(t *testing.T) {
		resp := getFeed(t, ts, "/v1/streams/devices/events?after=0&limit=3", "")
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); ct != feed.ContentType {
			t.Errorf("Content-Type %q, want %s", ct, feed.ContentType)
		}
		if hw := resp.Header.Get(feed.HeaderHighWatermark); hw != "5" {
			t.Errorf("%s: %q, want 5", feed.HeaderHighWatermark, hw)
		}
		body, err := io.ReadAll(resp.Body) // limit ends the answer
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
		if len(lines) != 3 {
			t.Fatalf("%d lines, want 3:\n%s", len(lines), body)
		}
		for i, raw := range lines {
			checkLine(t, ts, raw, int64(i+1))
		}
		resp2 := getFeed(t, ts, "/v1/streams/devices/events?after=3&limit=10", "")
		defer resp2.Body.Close()
		r := bufio.NewReader(resp2.Body)
		for want := int64(4); want <= 5; want++ {
			checkLine(t, ts, readFeedLine(t, r), want)
		}
	})

	t.Run("follows new events with heartbeats", func(t *testing.T) {
		resp := getFeed(t, ts, "/v1/streams/devices/events?after=4&heartbeat=1s", "")
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		checkLine(t, ts, readFeedLine(t, r), 5)
		l, err := feed.ParseLine([]byte(readFeedLine(t, r))) // nothing new: a heartbeat within a second
		if err != nil || l.Heartbeat == nil || l.Heartbeat.HighWatermark != 5 || l.Heartbeat.At.IsZero() {
			t.Fatalf("want a heartbeat with high_watermark 5, got %+v (%v)", l, err)
		}
		if _, err := b.Append(ctx, server.DeviceSource, []stream.Event{{NativeID: "evt_6", Type: "a.b", Payload: json.RawMessage(`{"n":6}`)}}); err != nil {
			t.Fatal(err)
		}
		for {
			raw := readFeedLine(t, r)
			if l, _ := feed.ParseLine([]byte(raw)); l.Heartbeat == nil {
				checkLine(t, ts, raw, 6)
				break
			}
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		for _, c := range []struct {
			path     string
			status   int
			mentions string
		}{
			{"/v1/streams/nowhere/events", 404, "nowhere"},
			{"/v1/streams/devices/events?after=-1", 400, "after"},
			{"/v1/streams/devices/events?after=9223372036854775000", 400, "after"}, // would overflow into small offsets
			{"/v1/streams/devices/events?after=one", 400, "after"},
			{"/v1/streams/devices/events?limit=-1", 400, "limit"},
			{"/v1/streams/devices/events?limit=ten", 400, "limit"},
			{"/v1/streams/devices/events?heartbeat=1ms", 400, "heartbeat"},
			{"/v1/streams/devices/events?heartbeat=often", 400, "heartbeat"},
		} {
			status, body := call(t, ts, "GET", c.path, "")
			msg := fmt.Sprint(body["error"])
			if status != c.status || !strings.Contains(msg, c.mentions) {
				t.Errorf("GET %s: %d %s, want %d naming %q", c.path, status, msg, c.status, c.mentions)
			}
		}
	})
}

// TestFeedToken: the feed takes the operator API's token.
func TestFeedToken(t *testing.T) {
	ts := start(t, server.Config{APIToken: "s3cret"}, nil)
	for _, tok := range []string{"", "wrong"} {
		resp := getFeedStatus(t, ts, "/v1/streams/devices/events?limit=1", tok)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: %d, want 401", tok, resp.StatusCode)
		}
	}
	resp := getFeed(t, ts, "/v1/streams/devices/events?heartbeat=1s", "s3cret")
	defer resp.Body.Close()
	if l, err := feed.ParseLine([]byte(readFeedLine(t, bufio.NewReader(resp.Body)))); err != nil || l.Heartbeat == nil {
		t.Fatalf("want a heartbeat on an empty stream, got %+v (%v)", l, err)
	}
}

// TestFeedSlowReader: a feed whose reader reads nothing holds no writer:
// ingest goes on at full speed, and a shutdown ends the feed at once.
func TestFeedSlowReader(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	ctx := testCtx(t, time.Minute)
	resp := getFeed(t, ts, "/v1/streams/devices/events?after=0", "")
	defer resp.Body.Close() // never read
	payload := json.RawMessage(`{"pad":"` + strings.Repeat("x", 16<<10) + `"}`)
	w := ts.Srv.Writer()
	for i := range 40 { // 40 × 100 × 16 KiB: far beyond the connection's buffers
		evs := make([]stream.Event, 100)
		for j := range evs {
			evs[j] = stream.Event{NativeID: fmt.Sprintf("evt_%d_%d", i, j), Type: "pad", Payload: payload}
		}
		done := make(chan error, 1)
		if err := w.AppendAsync(ctx, server.DeviceSource, evs, func(_ []stream.AppendResult, err error) { done <- err }); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("append %d waited 10s beside a feed nobody reads", i)
		}
	}
	began := time.Now()
	ts.Stop()
	if took := time.Since(began); took >= server.ShutdownTimeout {
		t.Errorf("shutdown took %s with a feed open: the feed did not end when shutdown began", took)
	}
}

func getFeedStatus(t *testing.T, ts *testServer, path, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t, time.Minute), "GET", ts.Base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := ts.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func getFeed(t *testing.T, ts *testServer, path, token string) *http.Response {
	t.Helper()
	resp := getFeedStatus(t, ts, path, token)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return resp
}

// readFeedLine reads one line, failing after 10 s.
func readFeedLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() {
		s, err := r.ReadString('\n')
		c <- res{s, err}
	}()
	select {
	case got := <-c:
		if got.err != nil {
			t.Fatalf("read a feed line: %v (read %q)", got.err, got.s)
		}
		return strings.TrimSuffix(got.s, "\n")
	case <-time.After(10 * time.Second):
		t.Fatal("no feed line within 10s")
		return ""
	}
}

// checkLine checks that raw is the line of the event at offset, its
// documents byte for byte.
func checkLine(t *testing.T, ts *testServer, raw string, offset int64) {
	t.Helper()
	if strings.ContainsAny(raw, "\r\n") {
		t.Fatalf("a line holds a line break: %q", raw)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		t.Fatalf("line %q is not a JSON object: %v", raw, err)
	}
	l, err := feed.ParseLine([]byte(raw))
	if err != nil {
		t.Fatalf("line %q: %v", raw, err)
	}
	want, err := ts.Srv.Streams().Event(context.Background(), server.DeviceSource, offset)
	if err != nil {
		t.Fatal(err)
	}
	got := l.Event()
	switch {
	case l.Offset != offset || l.ID != want.ID:
		t.Errorf("line %q: offset %d id %q, want %d %q", raw, l.Offset, l.ID, offset, want.ID)
	case got.NativeID != want.NativeID || got.Variant != want.Variant || got.Type != want.Type:
		t.Errorf("line %q: identity (%s, %s, %s), want (%s, %s, %s)", raw, got.NativeID, got.Variant, got.Type, want.NativeID, want.Variant, want.Type)
	case string(got.Payload) != string(want.Payload):
		t.Errorf("offset %d: payload %q, want the stored bytes %q", offset, got.Payload, want.Payload)
	case string(got.Metadata) != string(want.Metadata):
		t.Errorf("offset %d: metadata %q, want the stored bytes %q", offset, got.Metadata, want.Metadata)
	case !got.OccurredAt.Equal(want.OccurredAt) || l.StoredAt == nil || !l.StoredAt.Equal(want.StoredAt):
		t.Errorf("offset %d: times %v %v, want %v %v", offset, got.OccurredAt, l.StoredAt, want.OccurredAt, want.StoredAt)
	case (got.Sequence == nil) != (want.Sequence == nil) || got.Sequence != nil && *got.Sequence != *want.Sequence:
		t.Errorf("offset %d: sequence %v, want %v", offset, got.Sequence, want.Sequence)
	}
}
