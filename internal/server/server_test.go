package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	_ "modernc.org/sqlite" // the "sqlite" driver, for the lock-holding connection

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/buildinfo"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// testServer is a server running in-process for one test.
type testServer struct{ *servertest.Server }

// start runs a server for cfg until the test ends; see servertest.Start.
func start(t *testing.T, cfg server.Config, hc *http.Client) *testServer {
	t.Helper()
	return &testServer{servertest.Start(t, cfg, hc)}
}

// waitFor polls cond until it holds, failing the test after timeout.
var waitFor = testenv.Eventually

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, url string, opts client.Options) *client.Conn {
	t.Helper()
	c, err := client.Dial(testCtx(t, 10*time.Second), url, opts)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const testTS = "2026-02-16T23:10:21.123456Z"

// envelope returns a valid envelope.
func envelope(id, device, payload string) postbox.Envelope {
	return postbox.Envelope{
		SchemaVersion: postbox.SchemaVersion,
		EventID:       id,
		Type:          "sensor.reading",
		TS:            testTS,
		SessionID:     "sess-1",
		DeviceID:      device,
		Payload:       json.RawMessage(payload),
	}
}

func message(t *testing.T, e postbox.Envelope) client.Message {
	t.Helper()
	m, err := client.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func send(t *testing.T, c *client.Conn, msgs ...client.Message) []postbox.Reply {
	t.Helper()
	rs, err := c.Send(testCtx(t, 30*time.Second), msgs)
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if len(rs) != len(msgs) {
		t.Fatalf("Send: %d replies for %d envelopes", len(rs), len(msgs))
	}
	return rs
}

// storedRow is one stream_events row as the tests look at it.
type storedRow struct {
	Payload, SHA, CreatedAt, LastSeenAt string
	Attempts                            int
}

// rows returns the stored rows of eventID.
func (ts *testServer) rows(t *testing.T, eventID string) []storedRow {
	t.Helper()
	rs, err := ts.Store().ReadDB().Query(`SELECT raw_payload_json, payload_sha256, created_at, last_seen_at, attempt_count
		FROM stream_events WHERE source_native_id = ?`, eventID)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []storedRow
	for rs.Next() {
		var r storedRow
		if err := rs.Scan(&r.Payload, &r.SHA, &r.CreatedAt, &r.LastSeenAt, &r.Attempts); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// row returns the one stored row of eventID.
func (ts *testServer) row(t *testing.T, eventID string) storedRow {
	t.Helper()
	rs := ts.rows(t, eventID)
	if len(rs) != 1 {
		t.Fatalf("event %s: %d rows stored, want exactly 1", eventID, len(rs))
	}
	return rs[0]
}

func (ts *testServer) queryInt(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n sql.NullInt64
	if err := ts.Store().ReadDB().QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return int(n.Int64)
}

// metrics scrapes /metrics into series → value, a series being the
// metric name with its labels as Prometheus prints them.
// wantMetrics checks the values of metrics (with their labels) on /metrics,
// polling for up to 10s: some are counted just after the change a test
// sees through the API (a worker counts its attempt after it settled the
// item).
func (ts *testServer) wantMetrics(t *testing.T, want map[string]float64) {
	t.Helper()
	var wrong []string
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		m := ts.metrics(t)
		wrong = wrong[:0]
		for name, w := range want {
			if got, ok := m[name]; !ok || got != w {
				wrong = append(wrong, fmt.Sprintf("/metrics %s = %v (present %v), want %v", name, got, ok, w))
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range wrong {
		t.Error(w)
	}
}

func (ts *testServer) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := ts.HTTP.Get(ts.Base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("unreadable metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func ingressEvents(result string) string {
	return `postbox_ingress_events_total{result="` + result + `",source="devices"}`
}

// rawDial opens a WebSocket to the ingress without the client package, to
// send frames the client would never send.
func rawDial(t *testing.T, url string, opts *websocket.DialOptions) *websocket.Conn {
	t.Helper()
	if opts == nil {
		opts = &websocket.DialOptions{}
	}
	opts.Subprotocols = []string{ingress.Subprotocol}
	c, _, err := websocket.Dial(testCtx(t, 10*time.Second), url, opts)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(64 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func writeFrame(t *testing.T, c *websocket.Conn, frame string) {
	t.Helper()
	if err := c.Write(testCtx(t, 10*time.Second), websocket.MessageText, []byte(frame)); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

// readReplies reads reply frames until it holds at least n replies.
func readReplies(t *testing.T, c *websocket.Conn, n int, what string) []postbox.Reply {
	t.Helper()
	out, err := tryReadReplies(t, c, n)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return out
}

// tryReadReplies is readReplies that returns what it read when replies
// stop coming.
func tryReadReplies(t *testing.T, c *websocket.Conn, n int) ([]postbox.Reply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []postbox.Reply
	for len(out) < n {
		_, data, err := c.Read(ctx)
		if err != nil {
			return out, fmt.Errorf("%d of %d replies read: %w", len(out), n, err)
		}
		out = append(out, decodeReplies(t, data)...)
	}
	return out, nil
}

func decodeReplies(t *testing.T, data []byte) []postbox.Reply {
	t.Helper()
	var rs []postbox.Reply
	if len(data) > 0 && data[0] == '[' {
		if err := json.Unmarshal(data, &rs); err != nil {
			t.Fatalf("reply frame %q: %v", data, err)
		}
		return rs
	}
	var r postbox.Reply
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("reply frame %q: %v", data, err)
	}
	return []postbox.Reply{r}
}

func frameOf(msgs ...client.Message) string {
	parts := make([]string, len(msgs))
	for i, m := range msgs {
		parts[i] = string(m.Envelope)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// checkDuplicateACKs checks the replies to n deliveries of one event: all
// ACKs, exactly one of them (the first, when firstIsNew) not a duplicate,
// all with the first ACK's ack_ts; and one stored row counting n
// deliveries.
func checkDuplicateACKs(t *testing.T, ts *testServer, id string, rs []postbox.Reply, n int, firstIsNew bool) {
	t.Helper()
	if len(rs) != n {
		t.Fatalf("%d replies for %d deliveries", len(rs), n)
	}
	var first *postbox.Reply
	for i := range rs {
		r := &rs[i]
		if r.EventID != id || r.Status != postbox.StatusStored || r.AckTS == "" {
			t.Fatalf("reply %d: %+v, want an ACK of %s", i, *r, id)
		}
		if !r.Duplicate {
			if first != nil {
				t.Fatalf("reply %d: a second non-duplicate ACK %+v (first %+v)", i, *r, *first)
			}
			first = r
		}
	}
	if first == nil {
		t.Fatalf("no delivery of %s was ACKed as new: %+v", id, rs)
	}
	if firstIsNew && rs[0].Duplicate {
		t.Errorf("the first delivery was ACKed as a duplicate: %+v", rs[0])
	}
	var differ []int
	for i, r := range rs {
		if r.AckTS != first.AckTS {
			differ = append(differ, i)
		}
	}
	if len(differ) > 0 {
		t.Errorf("%d of %d ACKs have another ack_ts than the first ACK's %s, e.g. reply %d: %s (a redelivery is acknowledged with the original result)",
			len(differ), n, first.AckTS, differ[0], rs[differ[0]].AckTS)
	}
	row := ts.row(t, id)
	if row.Attempts != n {
		t.Errorf("attempt_count %d, want %d (one per delivery)", row.Attempts, n)
	}
}

// TestDuplicates: a redelivered event is stored once, ACKed every time as a
// duplicate with the original ack_ts and counted; a redelivery with another
// payload is a non-retryable conflict that changes nothing (contracts 3, 4).
func TestDuplicates(t *testing.T) {
	t.Parallel()
	ts := start(t, server.Config{}, nil)
	conn := dial(t, ts.WS, client.Options{})
	const n = 50

	t.Run("sequential", func(t *testing.T) {
		m := message(t, envelope("dup-seq", "pi-1", `{"n":1}`))
		var rs []postbox.Reply
		for range n {
			rs = append(rs, send(t, conn, m)...)
		}
		checkDuplicateACKs(t, ts, "dup-seq", rs, n, true)
	})

	t.Run("one frame", func(t *testing.T) {
		m := message(t, envelope("dup-frame", "pi-1", `{"n":2}`))
		msgs := make([]client.Message, n)
		for i := range msgs {
			msgs[i] = m
		}
		checkDuplicateACKs(t, ts, "dup-frame", send(t, conn, msgs...), n, true)
	})

	t.Run("pipelined frames", func(t *testing.T) {
		// Ten frames of five copies each, written back to back before any
		// reply is read, so they share group commits.
		raw := rawDial(t, ts.WS, nil)
		m := message(t, envelope("dup-pipe", "pi-1", `{"n":3}`))
		frame := frameOf(m, m, m, m, m)
		for range n / 5 {
			writeFrame(t, raw, frame)
		}
		rs := readReplies(t, raw, n, "pipelined duplicates")
		checkDuplicateACKs(t, ts, "dup-pipe", rs, n, false)
	})

	t.Run("mixed", func(t *testing.T) {
		// One single send, then concurrent sends of frames of several copies.
		m := message(t, envelope("dup-mixed", "pi-1", `{"n":4}`))
		first := send(t, conn, m)
		var mu sync.Mutex
		rs := append([]postbox.Reply(nil), first...)
		var wg sync.WaitGroup
		for range 7 {
			wg.Go(func() {
				got, err := conn.Send(testCtx(t, 30*time.Second), []client.Message{m, m, m, m, m, m, m})
				if err != nil {
					t.Errorf("Send: %v", err)
					return
				}
				mu.Lock()
				rs = append(rs, got...)
				mu.Unlock()
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		checkDuplicateACKs(t, ts, "dup-mixed", rs, 1+7*7, true)
	})

	t.Run("conflict", func(t *testing.T) {
		orig := message(t, envelope("dup-seq", "pi-1", `{"n":1}`))
		other := message(t, envelope("dup-seq", "pi-1", `{"n":"changed"}`))
		before := ts.row(t, "dup-seq")
		conflictsBefore := ts.metrics(t)[ingressEvents("conflict")]

		checkConflict := func(r postbox.Reply) {
			t.Helper()
			if r.Status != postbox.StatusNack || r.Code != postbox.CodeConflict || r.Retryable ||
				r.Field != "payload" || !strings.HasPrefix(r.Message, "payload:") || r.EventID != "dup-seq" {
				t.Errorf("redelivery with another payload: got %+v, want a non-retryable conflict NACK naming payload", r)
			}
		}
		checkConflict(send(t, conn, other)[0])
		if after := ts.row(t, "dup-seq"); after != before {
			t.Errorf("a conflict changed the stored event:\nbefore %+v\nafter  %+v", before, after)
		}

		// In one frame with genuine redeliveries: only those are counted.
		rs := send(t, conn, orig, other, orig)
		if !rs[0].OK() || !rs[0].Duplicate || !rs[2].OK() || !rs[2].Duplicate {
			t.Errorf("redeliveries beside a conflict: got %+v", rs)
		}
		checkConflict(rs[1])
		after := ts.row(t, "dup-seq")
		if after.Payload != before.Payload || after.SHA != before.SHA || after.Attempts != before.Attempts+2 {
			t.Errorf("after 2 redeliveries and a conflict: %+v, want payload unchanged and attempt_count %d", after, before.Attempts+2)
		}

		// A conflict inside the frame that first stores the event.
		a := message(t, envelope("dup-new-conflict", "pi-1", `{"v":"a"}`))
		b := message(t, envelope("dup-new-conflict", "pi-1", `{"v":"b"}`))
		rs = send(t, conn, a, b)
		if !rs[0].OK() || rs[0].Duplicate {
			t.Errorf("first delivery: got %+v, want a new ACK", rs[0])
		}
		if rs[1].Code != postbox.CodeConflict || rs[1].Retryable || rs[1].Field != "payload" {
			t.Errorf("conflicting delivery in the same frame: got %+v, want a conflict NACK", rs[1])
		}
		if r := ts.row(t, "dup-new-conflict"); r.Payload != `{"v":"a"}` || r.Attempts != 1 {
			t.Errorf("stored %+v, want payload {\"v\":\"a\"} with attempt_count 1", r)
		}

		if got := ts.metrics(t)[ingressEvents("conflict")] - conflictsBefore; got != 3 {
			t.Errorf("conflict metric grew by %v, want 3", got)
		}
	})

	if got := ts.queryInt(t, `SELECT count(*) FROM stream_events`); got != 5 {
		t.Errorf("%d rows in stream_events, want 5 (one per event id)", got)
	}
}

// badCase is one malformed frame and the NACKs it must earn.
type badCase struct {
	name  string
	frame string
	nacks int          // NACKs the frame earns; 0 means 1
	id    string       // event_id each NACK names ("" when it cannot be read)
	code  postbox.Code // code of each NACK
	field string       // field each NACK names; "" for the whole envelope
}

// fields returns a valid envelope as a map, to break one field at a time.
func fields(id string) map[string]any {
	return map[string]any{
		"schema_version": 1,
		"event_id":       id,
		"type":           "sensor.reading",
		"ts":             testTS,
		"session_id":     "sess-1",
		"device_id":      "pi-1",
		"payload":        map[string]any{"temp": 21.5},
	}
}

func encode(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// badCases returns every kind of malformed frame; prefix keeps the event
// ids of one round apart from another's.
func badCases(t *testing.T, prefix string) []badCase {
	with := func(id, key string, v any) string {
		f := fields(id)
		f[key] = v
		return encode(t, f)
	}
	without := func(id, key string) string {
		f := fields(id)
		delete(f, key)
		return encode(t, f)
	}
	id := func(s string) string { return prefix + "bad-" + s }
	longID := prefix + strings.Repeat("x", 200)
	cases := []badCase{
		{name: "empty object", frame: `{}`, code: postbox.CodeMissingField, field: "schema_version"},
		{name: "empty frame", frame: ``, code: postbox.CodeInvalidJSON},
		{name: "not JSON", frame: `this is not JSON`, code: postbox.CodeInvalidJSON},
		{name: "broken JSON object", frame: `{"schema_version":1,"event_id":`, code: postbox.CodeInvalidJSON},
		{name: "JSON string", frame: `"hello"`, code: postbox.CodeInvalidJSON},
		{name: "JSON number", frame: `42`, code: postbox.CodeInvalidJSON},
		{name: "JSON null", frame: `null`, code: postbox.CodeInvalidJSON},
		{name: "array of numbers", frame: `[1,2,3]`, nacks: 3, code: postbox.CodeInvalidJSON},
		{name: "missing event_id", frame: without("", "event_id"), code: postbox.CodeMissingField, field: "event_id"},
		{name: "event_id a number", frame: with("", "event_id", 7), code: postbox.CodeInvalidField, field: "event_id"},
		{name: "ts a number", frame: with(id("ts-number"), "ts", 1771283421), id: id("ts-number"), code: postbox.CodeInvalidField, field: "ts"},
		{name: "bad ts", frame: with(id("ts"), "ts", "yesterday"), id: id("ts"), code: postbox.CodeInvalidField, field: "ts"},
		{name: "schema_version a string", frame: with(id("sv-string"), "schema_version", "1"), id: id("sv-string"), code: postbox.CodeInvalidField, field: "schema_version"},
		{name: "schema_version 2", frame: with(id("sv-2"), "schema_version", 2), id: id("sv-2"), code: postbox.CodeUnsupportedVersion, field: "schema_version"},
		{name: "payload an array", frame: with(id("payload-array"), "payload", []int{1}), id: id("payload-array"), code: postbox.CodeInvalidField, field: "payload"},
		{name: "payload a string", frame: with(id("payload-string"), "payload", "x"), id: id("payload-string"), code: postbox.CodeInvalidField, field: "payload"},
		{name: "payload null", frame: with(id("payload-null"), "payload", nil), id: id("payload-null"), code: postbox.CodeMissingField, field: "payload"},
		{name: "unknown field", frame: with(id("unknown"), "devise", "x"), id: id("unknown"), code: postbox.CodeUnknownField, field: "devise"},
		{name: "event_id too long", frame: with(longID, "type", "t"), id: longID, code: postbox.CodeInvalidField, field: "event_id"},
		{name: "over the size limit", frame: with(id("too-large"), "payload", map[string]string{"blob": strings.Repeat("a", 2*maxEnvelope)}),
			id: id("too-large"), code: postbox.CodeTooLarge},
		{name: "bad envelope in an array", frame: "[" + without(id("in-array"), "type") + "]", id: id("in-array"), code: postbox.CodeMissingField, field: "type"},
		{name: "bad deliver_at", frame: with(id("deliver-at"), "deliver_at", "tomorrow"), id: id("deliver-at"), code: postbox.CodeInvalidField, field: "deliver_at"},
		{name: "deliver_at a number", frame: with(id("deliver-at-number"), "deliver_at", 1771283421), id: id("deliver-at-number"), code: postbox.CodeInvalidField, field: "deliver_at"},
		{name: "deliver_at too far", frame: with(id("deliver-at-far"), "deliver_at", time.Now().Add(400*24*time.Hour).UTC().Format(time.RFC3339)),
			id: id("deliver-at-far"), code: postbox.CodeInvalidField, field: "deliver_at"},
	}
	for _, key := range []string{"type", "ts", "session_id", "device_id", "payload", "schema_version"} {
		cases = append(cases, badCase{name: "missing " + key, frame: without(id("no-"+key), key), id: id("no-" + key), code: postbox.CodeMissingField, field: key})
	}
	return cases
}

const maxEnvelope = 1024

// checkNack checks that r refuses the envelope of c as c says.
func checkNack(t *testing.T, c badCase, r postbox.Reply) {
	t.Helper()
	ok := r.Status == postbox.StatusNack && !r.Retryable && r.Code == c.code && r.Field == c.field && r.EventID == c.id
	if c.field != "" {
		ok = ok && strings.HasPrefix(r.Message, c.field+":")
	} else {
		// A refusal of the whole envelope says so.
		ok = ok && (strings.HasPrefix(r.Message, "envelope") || strings.HasPrefix(r.Message, "frame"))
	}
	if !ok {
		t.Errorf("%s: got %+v\nwant a non-retryable NACK of %q with code %s naming field %q", c.name, r, c.id, c.code, c.field)
	}
}

// TestBadInput: on one connection, each malformed envelope earns exactly one
// NACK naming what is wrong, and valid envelopes sent between, beside and
// after them are ACKed and stored (contract 5).
func TestBadInput(t *testing.T) {
	t.Parallel()
	ts := start(t, server.Config{Limits: postbox.Limits{MaxEnvelopeBytes: maxEnvelope}}, nil)
	raw := rawDial(t, ts.WS, nil)
	valid := func(id string) string { return encode(t, fields(id)) }
	var stored []string

	// Lock-step: a valid envelope, then one malformed frame; read exactly
	// the replies both earn before going on, so every NACK is tied to its
	// frame even when it cannot name an event.
	for i, c := range badCases(t, "") {
		want := max(c.nacks, 1)
		vid := fmt.Sprintf("v-%02d", i)
		writeFrame(t, raw, valid(vid))
		writeFrame(t, raw, c.frame)
		var acked bool
		var nacks []postbox.Reply
		for !acked || len(nacks) < want {
			what := fmt.Sprintf("%s (ACK of %s: %v, NACKs: %d of %d)", c.name, vid, acked, len(nacks), want)
			for _, r := range readReplies(t, raw, 1, what) {
				switch {
				case r.EventID == vid:
					if acked || !r.OK() || r.Duplicate {
						t.Fatalf("%s: valid envelope %s beside it got %+v", c.name, vid, r)
					}
					acked = true
				default:
					nacks = append(nacks, r)
					if len(nacks) > want {
						t.Fatalf("%s: %d replies, want %d NACKs: %+v", c.name, len(nacks), want, nacks)
					}
				}
			}
		}
		for _, r := range nacks {
			checkNack(t, c, r)
		}
		stored = append(stored, vid)
	}

	// A refused envelope does not poison its event_id: the same id sent
	// valid afterwards is stored.
	writeFrame(t, raw, encode(t, func() map[string]any { f := fields("v-reuse"); f["ts"] = "nope"; return f }()))
	if r := readReplies(t, raw, 1, "bad ts of v-reuse")[0]; r.EventID != "v-reuse" || r.Code != postbox.CodeInvalidField || r.Field != "ts" {
		t.Fatalf("bad ts: got %+v", r)
	}
	writeFrame(t, raw, valid("v-reuse"))
	if r := readReplies(t, raw, 1, "valid v-reuse")[0]; r.EventID != "v-reuse" || !r.OK() || r.Duplicate {
		t.Fatalf("valid envelope after a refused one with its id: got %+v", r)
	}
	stored = append(stored, "v-reuse")

	// Pipelined: every frame written before any reply is read, malformed
	// envelopes also inside arrays of valid ones.
	cases := badCases(t, "p-")
	wantNacks := map[string]int{} // key of an expected NACK → count
	key := func(id string, code postbox.Code, field string) string { return id + "|" + string(code) + "|" + field }
	var wantAcks []string
	for i, c := range cases {
		vid := fmt.Sprintf("p-v-%02d", i)
		wantAcks = append(wantAcks, vid)
		if i%2 == 0 && strings.HasPrefix(c.frame, "{") {
			writeFrame(t, raw, "["+valid(vid)+","+c.frame+"]")
		} else {
			writeFrame(t, raw, valid(vid))
			writeFrame(t, raw, c.frame)
		}
		wantNacks[key(c.id, c.code, c.field)] += max(c.nacks, 1)
	}
	total := len(wantAcks)
	for _, n := range wantNacks {
		total += n
	}
	acks := map[string]bool{}
	replies, err := tryReadReplies(t, raw, total)
	if err != nil {
		t.Errorf("pipelined: %v", err)
	}
	for _, r := range replies {
		if r.OK() {
			if acks[r.EventID] || !strings.HasPrefix(r.EventID, "p-v-") || r.Duplicate {
				t.Errorf("pipelined: unexpected ACK %+v", r)
			}
			acks[r.EventID] = true
			continue
		}
		k := key(r.EventID, r.Code, r.Field)
		if wantNacks[k] == 0 || r.Retryable || r.Message == "" {
			t.Errorf("pipelined: unexpected NACK %+v", r)
			continue
		}
		wantNacks[k]--
	}
	for _, id := range wantAcks {
		if !acks[id] {
			t.Errorf("pipelined: valid envelope %s was not ACKed", id)
		}
	}
	for k, n := range wantNacks {
		if n != 0 {
			t.Errorf("pipelined: %d NACKs %s missing", n, k)
		}
	}
	if err != nil {
		t.FailNow()
	}
	stored = append(stored, wantAcks...)

	// The connection is still open and working.
	writeFrame(t, raw, valid("v-last"))
	if r := readReplies(t, raw, 1, "v-last"); len(r) != 1 || r[0].EventID != "v-last" || !r[0].OK() {
		t.Fatalf("last valid envelope: got %+v", r)
	}
	stored = append(stored, "v-last")

	for _, id := range stored {
		ts.row(t, id)
	}
	if got := ts.queryInt(t, `SELECT count(*) FROM stream_events`); got != len(stored) {
		t.Errorf("%d rows stored, want %d (the valid envelopes only)", got, len(stored))
	}
	if got := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE source_native_id LIKE '%bad-%' OR length(source_native_id) > 128`); got != 0 {
		t.Errorf("%d malformed envelopes were stored", got)
	}
}

// TestAuth: with tokens configured, a connection needs a known bearer token
// and may send only for its token's device.
func TestAuth(t *testing.T) {
	t.Parallel()
	tokens := ingress.Tokens{}
	tokens.Add("token-pi-1", "pi-1")
	tokens.Add("token-pi-2", "pi-2")
	ts := start(t, server.Config{Tokens: tokens}, nil)

	for _, tc := range []struct{ name, token string }{
		{"no token", ""},
		{"unknown token", "token-pi-3"},
		{"a token with a typo", "token-pi-l"},
	} {
		c, err := client.Dial(testCtx(t, 10*time.Second), ts.WS, client.Options{Token: tc.token})
		if !errors.Is(err, client.ErrUnauthorized) {
			if c != nil {
				c.Close()
			}
			t.Errorf("%s: Dial returned %v, want client.ErrUnauthorized", tc.name, err)
		}
	}
	// The refusal is an HTTP 401, also without the "Bearer " scheme.
	_, resp, err := websocket.Dial(testCtx(t, 10*time.Second), ts.WS, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"token-pi-1"}}, Subprotocols: []string{ingress.Subprotocol}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("token without Bearer: err %v, response %v; want a 401", err, resp)
	}

	pi1 := dial(t, ts.WS, client.Options{Token: "token-pi-1"})
	rs := send(t, pi1,
		message(t, envelope("auth-1", "pi-1", `{}`)),
		message(t, envelope("auth-2", "pi-2", `{}`)),
		message(t, envelope("auth-3", "pi-1", `{}`)))
	if !rs[0].OK() || !rs[2].OK() {
		t.Errorf("own device's events: got %+v and %+v, want ACKs", rs[0], rs[2])
	}
	if r := rs[1]; r.Status != postbox.StatusNack || r.Code != postbox.CodeForbidden || r.Field != "device_id" ||
		r.Retryable || !strings.HasPrefix(r.Message, "device_id:") || r.EventID != "auth-2" {
		t.Errorf("another device's event: got %+v, want a non-retryable forbidden NACK naming device_id", r)
	}
	if r := send(t, pi1, message(t, envelope("auth-4", "pi-1", `{}`)))[0]; !r.OK() {
		t.Errorf("after a forbidden event: got %+v, want an ACK", r)
	}
	if rows := ts.rows(t, "auth-2"); len(rows) != 0 {
		t.Errorf("the forbidden event was stored: %+v", rows)
	}

	// The other token sends for its own device, including the event id pi-1
	// was refused for.
	pi2 := dial(t, ts.WS, client.Options{Token: "token-pi-2"})
	if r := send(t, pi2, message(t, envelope("auth-2", "pi-2", `{}`)))[0]; !r.OK() || r.Duplicate {
		t.Errorf("pi-2 sending for pi-2: got %+v, want a new ACK", r)
	}
	for _, id := range []string{"auth-1", "auth-2", "auth-3", "auth-4"} {
		ts.row(t, id)
	}
	if got := ts.queryInt(t, `SELECT count(*) FROM stream_events`); got != 4 {
		t.Errorf("%d rows stored, want 4", got)
	}
}

// TestTLS: with a certificate configured the ingress speaks wss://.
func TestTLS(t *testing.T) {
	t.Parallel()
	certPath, keyPath, cert := servertest.SelfSignedCert(t, t.TempDir())
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	ts := start(t, server.Config{TLSCert: certPath, TLSKey: keyPath}, hc)
	if !strings.HasPrefix(ts.WS, "wss://") {
		t.Fatalf("url %s", ts.WS)
	}

	conn := dial(t, ts.WS, client.Options{HTTPClient: hc})
	if r := send(t, conn, message(t, envelope("tls-1", "pi-1", `{"secure":true}`)))[0]; !r.OK() {
		t.Fatalf("over wss: got %+v, want an ACK", r)
	}
	ts.row(t, "tls-1")

	// A client that does not trust the certificate, and one speaking
	// plain ws://, do not get through.
	if c, err := client.Dial(testCtx(t, 10*time.Second), ts.WS, client.Options{HTTPClient: &http.Client{}}); err == nil {
		c.Close()
		t.Errorf("a client without the certificate in its roots connected")
	}
	plain := strings.Replace(ts.WS, "wss://", "ws://", 1)
	if c, err := client.Dial(testCtx(t, 10*time.Second), plain, client.Options{}); err == nil {
		c.Close()
		t.Errorf("plain ws:// connected to the TLS listener")
	}
}

// lockDB takes the database's write lock from a connection of its own,
// which stalls the server's writer, and returns the function releasing it.
func lockDB(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the database write lock", func() bool {
		_, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE")
		return err == nil
	})
	var once sync.Once
	release = func() {
		once.Do(func() {
			if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Errorf("release the write lock: %v", err)
			}
			conn.Close()
			db.Close()
		})
	}
	t.Cleanup(release)
	return release
}

func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// writerBusyTimeout is the busy_timeout of the server's writer connection
// (internal/sqlitedb).
const writerBusyTimeout = 5 * time.Second

// TestBackpressure: while the writer is stalled the queue stays within its
// bound, the transport stops reading, memory stays bounded and senders
// wait; nothing is ACKed before it is committed, nothing is lost or stored
// twice (contracts 2, 6). Not parallel: it samples the heap.
func TestBackpressure(t *testing.T) {
	const queueSize = 100

	t.Run("stall shorter than busy_timeout", func(t *testing.T) {
		const (
			conns     = 4
			perConn   = 100 // frames
			frameSize = 50  // envelopes
			inFlight  = 50  // concurrent Sends per connection
			total     = conns * perConn * frameSize
		)
		// NORMAL: this test is about the queue, not fsync, and hundreds of
		// group commits with FULL take seconds on a slow disk.
		// The ingress keeps reading while the queue is full, up to its
		// memory bound, which is made small here.
		const frameBytes, bufferBytes = 512 << 10, 1 << 20
		ts := start(t, server.Config{QueueSize: queueSize, Synchronous: "NORMAL", WSMaxFrameBytes: frameBytes, WSBufferBytes: bufferBytes}, nil)
		if got := ts.Store().QueueCap(); got != queueSize {
			t.Fatalf("QueueCap %d, want %d", got, queueSize)
		}
		payload := `{"reading":"` + strings.Repeat("r", 512) + `"}`
		frames := make([][][]client.Message, conns)
		for c := range frames {
			frames[c] = make([][]client.Message, perConn)
			for f := range frames[c] {
				msgs := make([]client.Message, frameSize)
				for i := range msgs {
					msgs[i] = message(t, envelope(fmt.Sprintf("bp-%d-%03d-%02d", c, f, i), "pi-1", payload))
				}
				frames[c][f] = msgs
			}
		}
		clients := make([]*client.Conn, conns)
		for c := range clients {
			clients[c] = dial(t, ts.WS, client.Options{})
		}
		framesBefore := ts.metrics(t)["postbox_ingress_frames_total"]

		runtime.GC()
		baseline := heapInuse()
		release := lockDB(t, ts.DBPath)
		locked := time.Now()

		var completed, failed atomic.Int64
		var released atomic.Bool
		var wg sync.WaitGroup
		sendCtx, cancelSends := context.WithTimeout(context.Background(), 2*time.Minute)
		t.Cleanup(func() { cancelSends(); wg.Wait() }) // before the connections close
		for c := range conns {
			for g := range inFlight {
				wg.Go(func() {
					for f := g; f < perConn; f += inFlight {
						rs, err := clients[c].Send(sendCtx, frames[c][f])
						if err != nil {
							failed.Add(1)
							if sendCtx.Err() == nil { // else the test is ending and says why
								t.Errorf("sender %d/%d: Send: %v", c, g, err)
							}
							return
						}
						if !released.Load() {
							t.Errorf("a Send completed while the writer could not commit: %+v", rs[0])
						}
						for i, r := range rs {
							if !r.OK() || r.Duplicate || r.EventID != frames[c][f][i].EventID {
								t.Errorf("reply %+v to %s, want a new ACK", r, frames[c][f][i].EventID)
							}
						}
						completed.Add(1)
					}
				})
			}
		}
		allDone := make(chan struct{})
		go func() { wg.Wait(); close(allDone) }()

		// Sample the queue for the whole run, not only during the stall.
		var maxQueue atomic.Int64
		stopSampling := make(chan struct{})
		sampled := make(chan struct{})
		t.Cleanup(func() {
			select {
			case <-stopSampling:
			default:
				close(stopSampling)
			}
			<-sampled
		})
		go func() {
			defer close(sampled)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				maxQueue.Store(max(maxQueue.Load(), int64(ts.Store().QueueLen())))
				select {
				case <-stopSampling:
					return
				case <-tick.C:
				}
			}
		}()

		// The queue fills, then the stall holds for a while under load.
		waitFor(t, 3*time.Second, "the writer queue to fill", func() bool {
			return ts.Store().QueueLen() >= queueSize
		})
		// Hold the stall for a second, and well within the writer's
		// busy_timeout even on a loaded machine. The heap bound is coarse
		// (the senders' own frames count too); the frames-read and queue
		// bounds below are the precise backpressure checks.
		maxHeap := heapInuse()
		end := time.Now().Add(time.Second)
		if latest := locked.Add(writerBusyTimeout * 7 / 10); end.After(latest) {
			end = latest
		}
		tick := time.NewTicker(10 * time.Millisecond)
		for ; time.Now().Before(end); <-tick.C {
			maxHeap = max(maxHeap, heapInuse())
		}
		tick.Stop()
		if n := completed.Load(); n != 0 {
			t.Errorf("%d Sends completed while the writer was stalled; want all of them waiting", n)
		}
		framesRead := ts.metrics(t)["postbox_ingress_frames_total"] - framesBefore
		// Read and not answered: what the writer took (≤ queueSize), the
		// queue (≤ queueSize), one frame per connection reader and what
		// the ingress's buffer holds (each event at least its payload).
		if limit := float64(2*queueSize/frameSize + conns + 2 + bufferBytes/(frameSize*len(payload))); framesRead > limit {
			t.Errorf("the server read %v frames during the stall, want at most %v: the transport did not stop reading", framesRead, limit)
		}
		if stalled := time.Since(locked); stalled > writerBusyTimeout-time.Second {
			t.Fatalf("the stall lasted %v, too close to the writer's busy_timeout of %v for this test's assumptions", stalled, writerBusyTimeout)
		}
		released.Store(true)
		release()

		select {
		case <-allDone:
		case <-sendCtx.Done():
			t.Fatalf("senders did not finish after the stall: %d of %d frames ACKed", completed.Load(), conns*perConn)
		}
		close(stopSampling)
		<-sampled

		t.Logf("stall: %v frames read, queue max %d, heap +%.1f MiB", framesRead, maxQueue.Load(), float64(int64(maxHeap)-int64(baseline))/(1<<20))
		if q := maxQueue.Load(); q > queueSize {
			t.Errorf("queue depth reached %d, over its capacity %d", q, queueSize)
		}
		if maxHeap > baseline && maxHeap-baseline > 64<<20 {
			t.Errorf("heap in use grew by %d MiB during the stall, want < 64 MiB", (maxHeap-baseline)>>20)
		}
		if failed.Load() != 0 || completed.Load() != conns*perConn {
			t.Errorf("%d Sends failed, %d of %d completed", failed.Load(), completed.Load(), conns*perConn)
		}
		if got := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE source_native_id LIKE 'bp-%'`); got != total {
			t.Errorf("%d events stored, want %d", got, total)
		}
		if got := ts.queryInt(t, `SELECT sum(attempt_count) FROM stream_events WHERE source_native_id LIKE 'bp-%'`); got != total {
			t.Errorf("attempt counts sum to %d, want %d (each event delivered once)", got, total)
		}
		m := ts.metrics(t)
		if m[ingressEvents("stored")] != total || m[ingressEvents("duplicate")] != 0 || m[ingressEvents("unavailable")] != 0 {
			t.Errorf("ingress answered stored=%v duplicate=%v unavailable=%v, want %d ACKs, one per event",
				m[ingressEvents("stored")], m[ingressEvents("duplicate")], m[ingressEvents("unavailable")], total)
		}
	})

	t.Run("stall longer than busy_timeout", func(t *testing.T) {
		// The writer gives up after its busy_timeout: the events of that
		// group commit are NACKed as retryable, never ACKed, and stored
		// once when the sender sends them again.
		const (
			conns     = 2
			perConn   = 10
			frameSize = 20
			total     = conns * perConn * frameSize
		)
		ts := start(t, server.Config{QueueSize: queueSize}, nil)
		clients := make([]*client.Conn, conns)
		for c := range clients {
			clients[c] = dial(t, ts.WS, client.Options{})
		}
		release := lockDB(t, ts.DBPath)
		var released atomic.Bool
		firstNack := make(chan struct{})
		var nackOnce sync.Once
		var nacked, retries atomic.Int64
		var wg sync.WaitGroup
		sendCtx, cancelSends := context.WithTimeout(context.Background(), 2*time.Minute)
		t.Cleanup(func() { cancelSends(); wg.Wait() }) // before the connections close
		for c := range conns {
			for f := range perConn {
				var msgs []client.Message
				for i := range frameSize {
					msgs = append(msgs, message(t, envelope(fmt.Sprintf("long-%d-%02d-%02d", c, f, i), "pi-1", `{"x":1}`)))
				}
				wg.Go(func() {
					for attempt := 0; len(msgs) > 0; attempt++ {
						if attempt == 10 {
							t.Errorf("%d events still NACKed after %d attempts", len(msgs), attempt)
							return
						}
						if attempt > 0 {
							retries.Add(1)
						}
						rs, err := clients[c].Send(sendCtx, msgs)
						if err != nil {
							if sendCtx.Err() == nil {
								t.Errorf("Send: %v", err)
							}
							return
						}
						var again []client.Message
						for i, r := range rs {
							switch {
							case r.OK():
								if !released.Load() {
									t.Errorf("%s ACKed while the database was locked: %+v", r.EventID, r)
								}
								if r.Duplicate {
									t.Errorf("%s ACKed as a duplicate after a retryable NACK: the failed commit left it stored", r.EventID)
								}
							case r.Retryable && r.Code == postbox.CodeOutage:
								nacked.Add(1)
								nackOnce.Do(func() { close(firstNack) })
								again = append(again, msgs[i])
							default:
								t.Errorf("%s: got %+v, want an ACK or a retryable NACK", msgs[i].EventID, r)
							}
						}
						msgs = again
					}
				})
			}
		}
		allDone := make(chan struct{})
		go func() { wg.Wait(); close(allDone) }()

		locked := time.Now()
		select {
		case <-firstNack:
		case <-allDone:
			t.Fatal("every sender finished while the database was locked")
		case <-time.After(writerBusyTimeout + 30*time.Second):
			t.Fatal("no retryable NACK while the database stayed locked past the writer's busy_timeout")
		}
		if waited := time.Since(locked); waited < writerBusyTimeout-500*time.Millisecond {
			t.Errorf("the writer gave up after %v, before its busy_timeout of %v", waited, writerBusyTimeout)
		}
		released.Store(true)
		release()
		select {
		case <-allDone:
		case <-sendCtx.Done():
			t.Fatal("senders did not finish after the lock was released")
		}
		t.Logf("%d NACKs, %d resends", nacked.Load(), retries.Load())
		if got := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE source_native_id LIKE 'long-%'`); got != total {
			t.Errorf("%d events stored, want %d", got, total)
		}
		if got := ts.queryInt(t, `SELECT count(*) FROM stream_events WHERE attempt_count <> 1`); got != 0 {
			t.Errorf("%d events have attempt_count <> 1: a failed commit was partly kept", got)
		}
		m := ts.metrics(t)
		if m["postbox_writer_failures_total"] < 1 || m[ingressEvents("unavailable")] != float64(nacked.Load()) {
			t.Errorf("writer failures %v, unavailable %v; want ≥ 1 and %d", m["postbox_writer_failures_total"], m[ingressEvents("unavailable")], nacked.Load())
		}
	})
}

// TestHTTPEndpoints: /health, /ready (503 before Run and after it returns)
// and /metrics.
func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewDefault(server.Config{Listener: ln, DBPath: filepath.Join(t.TempDir(), "postbox.db")})
	if err != nil {
		t.Fatal(err)
	}
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(srv.Handler(), "/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready before Run: %d %s, want 503", code, body)
	}

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	var runErr error
	go func() { runErr = srv.Run(ctx); close(stopped) }()
	stop := func() error {
		cancel()
		select {
		case <-stopped:
			return runErr
		case <-time.After(30 * time.Second):
			return errors.New("Run did not return 30s after its context ended")
		}
	}
	t.Cleanup(func() { stop() })
	base := "http://" + ln.Addr().String()
	httpGet := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	waitFor(t, 10*time.Second, "/ready", func() bool {
		resp, err := http.Get(base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if code, body := httpGet("/health"); code != http.StatusOK || !strings.Contains(body, `"ok"`) || !strings.Contains(body, `"version":"`+buildinfo.Get().Version+`"`) {
		t.Errorf("/health: %d %s", code, body)
	}
	if code, body := httpGet("/ready"); code != http.StatusOK || !strings.Contains(body, `"queue_capacity"`) {
		t.Errorf("/ready: %d %s", code, body)
	}
	if code, _ := httpGet("/nope"); code != http.StatusNotFound {
		t.Errorf("/nope: %d, want 404", code)
	}

	conn := dial(t, "ws://"+ln.Addr().String(), client.Options{})
	if r := send(t, conn, message(t, envelope("metrics-1", "pi-1", `{}`)))[0]; !r.OK() {
		t.Fatalf("got %+v", r)
	}
	code, body := httpGet("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		ingressEvents("stored") + " 1",
		"postbox_writer_queue_depth 0",
		"postbox_writer_queue_capacity 10000",
		"postbox_ingress_connections 1",
		"postbox_writer_batch_events_count",
		`postbox_build_info{commit="` + buildinfo.Get().Commit + `",go_version="` + runtime.Version() + `",version="` + buildinfo.Get().Version + `"} 1`,
	} {
		if !strings.Contains(body, want+"\n") && !strings.Contains(body, want+" ") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	conn.Close()

	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if code, _ := get(srv.Handler(), "/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready after Run returned: %d, want 503", code)
	}
}

// TestShutdownAnswersWhatItRead: at shutdown the server stops reading,
// but every envelope it already read is committed and answered before the
// connection closes, so a sender does not have to resend it.
func TestShutdownAnswersWhatItRead(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	c := dial(t, ts.WS, client.Options{})
	release := lockDB(t, ts.DBPath) // hold the writer so the events are in flight at shutdown
	msgs := make([]client.Message, 50)
	for i := range msgs {
		msgs[i] = message(t, envelope(fmt.Sprintf("evt_shutdown_%02d", i), "pi-1", `{"n":1}`))
	}
	type result struct {
		replies []postbox.Reply
		err     error
	}
	sent := make(chan result, 1)
	go func() {
		rs, err := c.Send(testCtx(t, 30*time.Second), msgs)
		sent <- result{rs, err}
	}()
	waitFor(t, 10*time.Second, "the server to read the frame", func() bool { return ts.metrics(t)["postbox_ingress_frames_total"] >= 1 })
	stopped := make(chan struct{})
	go func() { ts.Stop(); close(stopped) }()
	// Shutdown closes the listener, then drains the connections: once a
	// new connection is refused, the drain waits for the answers.
	waitFor(t, 10*time.Second, "shutdown to close the listener", func() bool {
		conn, err := net.Dial("tcp", ts.Addr)
		if err != nil {
			return true
		}
		conn.Close()
		return false
	})
	release()
	r := <-sent
	if r.err != nil {
		t.Fatalf("Send failed at shutdown instead of being answered: %v", r.err)
	}
	for _, rep := range r.replies {
		if !rep.OK() {
			t.Errorf("%s: %+v, want an ACK", rep.EventID, rep)
		}
	}
	<-stopped
	if err := c.Err(); err == nil || !strings.Contains(err.Error(), "GoingAway") {
		t.Errorf("after shutdown the connection error is %v, want a going-away close", err)
	}
}
