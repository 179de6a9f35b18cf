package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/internal/agent"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/retry"
)

const device = "dev-1"

// testServer is a real postbox server running in-process.
type testServer struct {
	srv  *servertest.Server
	addr string
	stop func()
}

// startServer runs a server for cfg until the test ends or stop is
// called; see servertest.Start.
func startServer(t *testing.T, cfg server.Config) *testServer {
	t.Helper()
	s := servertest.Start(t, cfg, nil)
	return &testServer{srv: s, addr: s.Addr, stop: s.Stop}
}

// stored returns how many events the server holds for the device, how
// many distinct event ids, and the sum of their delivery counts.
func (s *testServer) stored(t testing.TB) (n, distinct, deliveries int64) {
	t.Helper()
	err := s.srv.Store().ReadDB().QueryRow(`SELECT count(*), count(DISTINCT source_native_id), coalesce(sum(attempt_count), 0)
		FROM stream_events WHERE json_extract(metadata_json, '$.device_id') = ?`, device).Scan(&n, &distinct, &deliveries)
	if err != nil {
		t.Fatal(err)
	}
	return n, distinct, deliveries
}

// has reports whether the server stores n events, for polling: it reads
// the last offset (cheap) before it counts.
func (s *testServer) has(t testing.TB, n int64) bool {
	t.Helper()
	var last int64
	db := s.srv.Store().ReadDB()
	if err := db.QueryRow(`SELECT coalesce(max("offset"), 0) FROM stream_events`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if last < n {
		return false
	}
	var count int64
	if err := db.QueryRow(`SELECT count(*) FROM stream_events`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	return count == n
}

// ids returns the stored event ids of the device and their payloads.
func (s *testServer) ids(t testing.TB) map[string]string {
	t.Helper()
	rows, err := s.srv.Store().ReadDB().Query(`SELECT source_native_id, raw_payload_json FROM stream_events
		WHERE json_extract(metadata_json, '$.device_id') = ?`, device)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, payload string
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		out[id] = payload
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// testAgent is a real agent running in-process.
type testAgent struct {
	a    *agent.Agent
	url  string // http://host:port of the intake
	stop func()
}

var fastRelay = outbox.RelayConfig{
	PollInterval: 20 * time.Millisecond,
	Retry:        retry.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond},
	Reconnect:    retry.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond},
}

// startAgent runs an agent for cfg until the test ends. Empty fields get
// a device id, an outbox under t.TempDir(), a loopback intake and a fast
// relay.
func startAgent(t *testing.T, cfg agent.Config) *testAgent {
	t.Helper()
	if cfg.DeviceID == "" {
		cfg.DeviceID = device
	}
	if cfg.OutboxPath == "" {
		cfg.OutboxPath = filepath.Join(t.TempDir(), "outbox.db")
	}
	if cfg.Relay.PollInterval == 0 {
		cfg.Relay = fastRelay
	}
	if cfg.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = ln
	}
	a, err := agent.New(cfg)
	if err != nil {
		cfg.Listener.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	ta := &testAgent{a: a, url: "http://" + cfg.Listener.Addr().String()}
	ta.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("agent did not stop within 15s")
			}
		})
	}
	t.Cleanup(ta.stop)
	return ta
}

func (a *testAgent) post(t testing.TB, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(a.url+"/v1/events", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

type eventStatus struct {
	EventID string `json:"event_id"`
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
}

// decodeStrict decodes b into v, refusing unknown fields.
func decodeStrict(t testing.TB, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
}

// postBatch posts events as one array and returns their ids; every event
// must be queued.
func (a *testAgent) postBatch(t testing.TB, events []string) []string {
	t.Helper()
	status, body := a.post(t, "["+strings.Join(events, ",")+"]")
	if status != http.StatusAccepted {
		t.Fatalf("POST of %d events: %d %s", len(events), status, body)
	}
	var resp struct{ Events []eventStatus }
	decodeStrict(t, body, &resp)
	if len(resp.Events) != len(events) {
		t.Fatalf("POST of %d events answered %d", len(events), len(resp.Events))
	}
	ids := make([]string, len(events))
	for i, e := range resp.Events {
		if e.Status != "queued" || e.EventID == "" {
			t.Fatalf("event %d: %+v, want queued", i, e)
		}
		ids[i] = e.EventID
	}
	return ids
}

func (a *testAgent) counts(t testing.TB) (pending, rejected int64) {
	t.Helper()
	p, r, err := a.a.Store().Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

// empty reports whether the outbox holds no rows. The outbox has one
// connection, shared with the agent: poll it only when the server says
// the work may be done.
func (a *testAgent) empty(t testing.TB) bool {
	p, r := a.counts(t)
	return p == 0 && r == 0
}

func (a *testAgent) rows(t testing.TB) map[string]outboxsqlite.Row {
	t.Helper()
	rows, err := a.a.Store().List(context.Background(), "", 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]outboxsqlite.Row{}
	for _, r := range rows {
		out[r.EventID] = r
	}
	return out
}

// envelopes returns the envelopes the relay would send for the queued
// rows, by event id: each due message as client.Publisher encodes it,
// decoded as the server decodes it.
func (a *testAgent) envelopes(t testing.TB) map[string]postbox.Envelope {
	t.Helper()
	msgs, err := a.a.Store().Due(context.Background(), time.Now().Add(24*time.Hour), 0, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]postbox.Envelope{}
	for _, m := range msgs {
		b, err := json.Marshal(m.Envelope())
		if err != nil {
			t.Fatal(err)
		}
		env, err := postbox.DecodeEnvelope(b, postbox.Limits{})
		if err != nil {
			t.Fatalf("queued event %s: envelope %s: %v", m.EventID, b, err)
		}
		out[m.EventID] = env
	}
	return out
}

func smallEvents(n, from int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"type":"sensor.reading","payload":{"n":%d}}`, from+i)
	}
	return out
}

// unreachable is a server address nothing listens on: the agent's relay
// keeps failing, so what the intake queued stays in the outbox.
const unreachable = "ws://127.0.0.1:1"

func TestIntakeQueuesOneEventAndFillsItIn(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable, SessionID: "sess-test"})
	before := time.Now()
	status, body := ta.post(t, `{"type":"door.opened","payload":{"door":3}}`)
	after := time.Now()
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s, want 202", status, body)
	}
	var resp eventStatus
	decodeStrict(t, body, &resp)
	if resp.Status != "queued" || !strings.HasPrefix(resp.EventID, "evt_") || len(resp.EventID) != len("evt_")+26 {
		t.Fatalf("response %s, want {event_id: evt_<ULID>, status: queued}", body)
	}
	rows := ta.rows(t)
	r, ok := rows[resp.EventID]
	if !ok || len(rows) != 1 || r.State != outboxsqlite.StatePending {
		t.Fatalf("outbox: %+v, want the one event pending", rows)
	}
	if string(r.Payload) != `{"door":3}` || r.CorrelationID != "sess-test" || r.TenantID != device {
		t.Fatalf("queued row %+v", r)
	}
	env := ta.envelopes(t)[resp.EventID]
	if env.EventID != resp.EventID || env.SchemaVersion != postbox.SchemaVersion || env.Type != "door.opened" ||
		env.SessionID != "sess-test" || env.DeviceID != device || string(env.Payload) != `{"door":3}` {
		t.Fatalf("queued envelope %+v", env)
	}
	if ts := env.Time(); ts.Before(before.Add(-time.Millisecond)) || ts.After(after.Add(time.Millisecond)) {
		t.Fatalf("ts %s not the time of the request (%s .. %s)", env.TS, before, after)
	}
}

func TestIntakeQueuesAnArrayAndKeepsGivenFields(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	status, body := ta.post(t, `[
		{"type":"a","payload":{}},
		{"schema_version":1,"event_id":"evt-given","type":"b","ts":"2030-01-02T03:04:05.5Z","session_id":"sess-own","device_id":"dev-1","seq":7,"payload":{"k":[1,2]}}
	]`)
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", status, body)
	}
	var resp struct{ Events []eventStatus }
	decodeStrict(t, body, &resp)
	if len(resp.Events) != 2 || resp.Events[0].Status != "queued" || !strings.HasPrefix(resp.Events[0].EventID, "evt_") ||
		resp.Events[1] != (eventStatus{EventID: "evt-given", Status: "queued"}) {
		t.Fatalf("response %s", body)
	}
	rows := ta.rows(t)
	if len(rows) != 2 {
		t.Fatalf("outbox holds %d rows, want 2", len(rows))
	}
	envs := ta.envelopes(t)
	env := envs["evt-given"]
	if env.TS != "2030-01-02T03:04:05.5Z" || env.SessionID != "sess-own" || env.Seq == nil || *env.Seq != 7 || string(env.Payload) != `{"k":[1,2]}` {
		t.Fatalf("given fields changed: %+v", env)
	}
	first := envs[resp.Events[0].EventID]
	if !strings.HasPrefix(first.SessionID, "sess_") || first.DeviceID != device {
		t.Fatalf("filled envelope %+v: want the agent's own sess_<ULID> session and device", first)
	}
}

func TestIntakeRefusesBadInputNamingTheField(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	good := `{"type":"ok","payload":{}}`
	for _, tc := range []struct {
		name, body  string
		code, field string
		index       int // -1: no index
	}{
		{"empty body", "", "invalid_json", "", -1},
		{"blank body", " \n ", "invalid_json", "", -1},
		{"not JSON", "hello", "invalid_json", "", -1},
		{"broken JSON", `{"type":"t",`, "invalid_json", "", -1},
		{"empty array", `[]`, "invalid_json", "", -1},
		{"payload an array", `{"type":"t","payload":[1]}`, "invalid_field", "payload", -1},
		{"payload a string", `{"type":"t","payload":"x"}`, "invalid_field", "payload", -1},
		{"payload missing", `{"type":"t"}`, "missing_field", "payload", -1},
		{"type missing", `{"payload":{}}`, "missing_field", "type", -1},
		{"bad ts", `{"type":"t","ts":"yesterday","payload":{}}`, "invalid_field", "ts", -1},
		{"ts a number", `{"type":"t","ts":5,"payload":{}}`, "invalid_field", "ts", -1},
		{"unknown field", `{"type":"t","payload":{},"colour":"red"}`, "unknown_field", "colour", -1},
		{"other device", `{"type":"t","device_id":"dev-2","payload":{}}`, "forbidden", "device_id", -1},
		{"scheduled", `{"type":"t","deliver_at":"2030-01-02T03:04:05Z","payload":{}}`, "invalid_field", "deliver_at", -1},
		{"bad deliver_at", `{"type":"t","deliver_at":"soon","payload":{}}`, "invalid_field", "deliver_at", -1},
		{"bad schema version", `{"schema_version":9,"type":"t","payload":{}}`, "unsupported_version", "schema_version", -1},
		{"one bad in an array", "[" + good + `,{"type":"t","ts":"yesterday","payload":{}},` + good + "]", "invalid_field", "ts", 1},
		{"first bad in an array", `[{"type":"t","device_id":"dev-9","payload":{}},` + good + "]", "forbidden", "device_id", 0},
		{"not an object in an array", "[" + good + ",42]", "invalid_json", "", 1},
		{"an envelope over the limit", "[" + good + `,{"type":"t","payload":{"pad":"` + strings.Repeat("x", 300<<10) + `"}}]`, "too_large", "", 1},
		// Under the limit as sent, over it once event_id, ts, session_id
		// and device_id are filled in: the server would refuse it.
		{"an envelope over the limit once filled", "[" + good + `,{"type":"t","payload":{"pad":"` + strings.Repeat("x", 256<<10-40) + `"}}]`, "too_large", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := ta.post(t, tc.body)
			want := http.StatusBadRequest
			if tc.code == "too_large" {
				want = http.StatusRequestEntityTooLarge
			}
			if status != want {
				t.Fatalf("%d %.300s, want %d", status, body, want)
			}
			var resp struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
					Field   string `json:"field"`
					Index   *int   `json:"index"`
				} `json:"error"`
			}
			decodeStrict(t, body, &resp)
			e := resp.Error
			if !typedCode(e.Code) {
				t.Fatalf("error %s: code %q is neither in api.Codes nor a NACK code", body, e.Code)
			}
			if e.Code != tc.code || e.Field != tc.field || e.Message == "" {
				t.Fatalf("error %s, want code %q field %q and a message", body, tc.code, tc.field)
			}
			if tc.field != "" && !strings.Contains(e.Message, tc.field) {
				t.Fatalf("message %q does not name the field %q", e.Message, tc.field)
			}
			switch {
			case tc.index < 0 && e.Index != nil:
				t.Fatalf("error %s has an index, want none for a single event", body)
			case tc.index >= 0 && (e.Index == nil || *e.Index != tc.index):
				t.Fatalf("error %s, want index %d", body, tc.index)
			}
			if p, r := ta.counts(t); p != 0 || r != 0 {
				t.Fatalf("after a refused request the outbox holds %d pending, %d rejected; want nothing queued", p, r)
			}
		})
	}
}

// typedCode reports whether code is one of the API's (api.Codes) or a
// NACK code of the protocol (postbox.Code).
func typedCode(code string) bool {
	for _, ci := range api.Codes() {
		if string(ci.Code) == code {
			return true
		}
	}
	switch postbox.Code(code) {
	case postbox.CodeInvalidJSON, postbox.CodeMissingField, postbox.CodeInvalidField, postbox.CodeUnknownField,
		postbox.CodeUnsupportedVersion, postbox.CodeTooLarge, postbox.CodeConflict, postbox.CodeForbidden,
		postbox.CodeUnavailable, postbox.CodeOutage:
		return true
	}
	return false
}

// TestIntakeRefusesWithTypedCodes: the answers that are not about one
// envelope (a body over the limit, a body cut short, a store that fails)
// carry the API's codes too, with their statuses.
func TestIntakeRefusesWithTypedCodes(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	errorCode := func(resp *http.Response) string {
		t.Helper()
		defer resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &e); err != nil || !typedCode(e.Error.Code) {
			t.Fatalf("%s %s: want an error with a typed code (%v)", resp.Status, b, err)
		}
		return e.Error.Code
	}
	// Over the limit: a body that never ends is cut at MaxIntakeBytes.
	resp, err := http.Post(ta.url+"/v1/events", "application/json", io.LimitReader(zeros{}, agent.MaxIntakeBytes+1))
	if err != nil {
		t.Fatal(err)
	}
	if code := errorCode(resp); resp.StatusCode != http.StatusRequestEntityTooLarge || code != string(api.CodeTooLarge) {
		t.Fatalf("a body over the limit: %s %s, want 413 %s", resp.Status, code, api.CodeTooLarge)
	}
	// A body shorter than its Content-Length: the read fails.
	conn, err := net.Dial("tcp", strings.TrimPrefix(ta.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"type\":")
	conn.(*net.TCPConn).CloseWrite()
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if code := errorCode(resp); resp.StatusCode != http.StatusBadRequest || code != string(api.CodeInvalidJSON) {
		t.Fatalf("a body cut short: %s %s, want 400 %s", resp.Status, code, api.CodeInvalidJSON)
	}
}

// zeros is an endless reader of spaces.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// TestIntakeTakesTraceparentHeader: events without a trace context of
// their own take the request's traceparent and tracestate headers; an
// event's own is kept; a header that is not valid is ignored.
func TestIntakeTakesTraceparentHeader(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	const header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	const own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	post := func(traceparent, tracestate, body string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, ta.url+"/v1/events", strings.NewReader(body))
		req.Header.Set("traceparent", traceparent)
		req.Header.Set("tracestate", tracestate)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST: %s %s", resp.Status, b)
		}
	}
	post(header, "vendor=1", `[{"event_id":"evt-h","type":"t","payload":{}},{"event_id":"evt-own","type":"t","traceparent":"`+own+`","payload":{}}]`)
	post("00-not-a-traceparent", "vendor=1", `{"event_id":"evt-bad","type":"t","payload":{}}`)
	envs := ta.envelopes(t)
	for id, want := range map[string][2]string{"evt-h": {header, "vendor=1"}, "evt-own": {own, ""}, "evt-bad": {"", ""}} {
		e, ok := envs[id]
		if !ok || e.TraceParent != want[0] || e.TraceState != want[1] {
			t.Fatalf("%s: queued %+v (found %v), want traceparent %q tracestate %q", id, e, ok, want[0], want[1])
		}
	}
}

func TestIntakeDuplicateAndConflict(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	ev := `{"event_id":"evt-dup","type":"t","ts":"2030-01-02T03:04:05Z","payload":{"a":1}}`
	for i, want := range []string{"queued", "duplicate"} {
		status, body := ta.post(t, ev)
		var resp eventStatus
		decodeStrict(t, body, &resp)
		if status != http.StatusAccepted || resp != (eventStatus{EventID: "evt-dup", Status: want}) {
			t.Fatalf("POST %d: %d %s, want 202 %s", i, status, body, want)
		}
	}
	stored := ta.envelopes(t)["evt-dup"]

	status, body := ta.post(t, `{"event_id":"evt-dup","type":"t","ts":"2030-01-02T03:04:05Z","payload":{"a":2}}`)
	var resp eventStatus
	decodeStrict(t, body, &resp)
	if status != http.StatusConflict || resp.EventID != "evt-dup" || resp.Status != "conflict" || resp.Message == "" {
		t.Fatalf("same id, other payload: %d %s, want 409 conflict", status, body)
	}
	if got := ta.envelopes(t)["evt-dup"]; !reflect.DeepEqual(got, stored) {
		t.Fatalf("the conflict changed the queued event:\n%+v\nwant\n%+v", got, stored)
	}

	status, body = ta.post(t, "["+ev+`,{"event_id":"evt-new","type":"t","payload":{}}]`)
	var batch struct{ Events []eventStatus }
	decodeStrict(t, body, &batch)
	if status != http.StatusAccepted || len(batch.Events) != 2 || batch.Events[0].Status != "duplicate" || batch.Events[1].Status != "queued" {
		t.Fatalf("array with a duplicate: %d %s", status, body)
	}
	if p, _ := ta.counts(t); p != 2 {
		t.Fatalf("outbox holds %d rows, want evt-dup and evt-new", p)
	}

	// The same id and payload with another type is a conflict too, as the
	// server would judge it.
	status, body = ta.post(t, `{"event_id":"evt-dup","type":"other","ts":"2030-01-02T03:04:05Z","payload":{"a":1}}`)
	decodeStrict(t, body, &resp)
	if status != http.StatusConflict || resp.Status != "conflict" || !strings.Contains(resp.Message, "type") {
		t.Fatalf("same id and payload, other type: %d %s, want 409 conflict", status, body)
	}
	// An event the server refused is answered rejected, with the reason,
	// not duplicate: it will not be sent again.
	if err := ta.a.Store().Settle(context.Background(), []outbox.Outcome{{EventID: "evt-new", Kind: outbox.Rejected, Error: "invalid_field: payload"}}); err != nil {
		t.Fatal(err)
	}
	status, body = ta.post(t, `{"event_id":"evt-new","type":"t","payload":{}}`)
	decodeStrict(t, body, &resp)
	if status != http.StatusConflict || resp.Status != "rejected" || !strings.Contains(resp.Message, "invalid_field: payload") || !strings.Contains(resp.Message, "requeue") {
		t.Fatalf("a refused event sent again: %d %s, want 409 rejected with the reason", status, body)
	}
}

func TestAgentDeliversEverythingEndToEnd(t *testing.T) {
	srv := startServer(t, server.Config{})
	ta := startAgent(t, agent.Config{Server: "ws://" + srv.addr})
	const n, per = 2000, 200
	var ids []string
	for i := 0; i < n; i += per {
		ids = append(ids, ta.postBatch(t, smallEvents(per, i))...)
	}
	testenv.Eventually(t, 60*time.Second, "all events at the server and an empty outbox", func() bool {
		return srv.has(t, n) && ta.empty(t)
	})
	got, distinct, _ := srv.stored(t)
	stored := srv.ids(t)
	if got != n || distinct != n || len(stored) != n {
		t.Fatalf("server holds %d events, %d distinct; want %d", got, distinct, n)
	}
	for i, id := range ids {
		if p, ok := stored[id]; !ok || p != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("event %d (%s): stored %v with payload %s", i, id, ok, p)
		}
	}
	// The relay counts a publish just after settling it: poll.
	var metrics []byte
	testenv.Eventually(t, 10*time.Second, "the relay to count 2000 deliveries", func() bool {
		resp, err := http.Get(ta.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(metrics), `postbox_relay_events_total{result="delivered"} 2000`)
	})
	for _, want := range []string{
		`postbox_agent_intake_events_total{result="queued"} 2000`,
		`postbox_relay_events_total{result="delivered"} 2000`,
		`postbox_outbox_events{state="pending"} 0`,
		`postbox_outbox_events{state="rejected"} 0`,
		`postbox_outbox_oldest_pending_age_seconds 0`,
	} {
		if !strings.Contains(string(metrics), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// proxy forwards TCP connections to a target and can cut them all
// abruptly (RST on both sides), by hand or after every cutEvery bytes sent
// towards the target, and can cut each connection on its own a while after
// it was accepted (setLifetime).
type proxy struct {
	ln       net.Listener
	cutEvery int64

	mu       sync.Mutex
	target   string // "" refuses connections
	conns    map[net.Conn]struct{}
	up       int64 // bytes forwarded to the target
	nextCut  int64
	lifeMin  time.Duration // 0: connections live until cut otherwise
	lifeSpan time.Duration
	closed   bool

	cuts atomic.Int64 // cuts that closed at least one connection
	wg   sync.WaitGroup
}

func newProxy(t *testing.T, target string, cutEvery int64) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, cutEvery: cutEvery, nextCut: cutEvery, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// setLifetime has the proxy cut each connection it accepts from now on
// (both sides, abruptly) between min and max after accepting it: a link
// that works, but never for long.
func (p *proxy) setLifetime(min, max time.Duration) {
	p.mu.Lock()
	p.lifeMin, p.lifeSpan = min, max-min
	p.mu.Unlock()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		if target == "" {
			c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.conns[s] = struct{}{}
		life := p.lifeMin
		if p.lifeSpan > 0 {
			life += rand.N(p.lifeSpan)
		}
		p.mu.Unlock()
		end := func() {}
		if life > 0 {
			timer := time.AfterFunc(life, func() {
				if p.reset(c, s) {
					p.cuts.Add(1)
				}
			})
			end = func() { timer.Stop() }
		}
		p.wg.Add(2)
		go func() { p.pipe(s, c, true); end() }()
		go p.pipe(c, s, false)
	}
}

func (p *proxy) pipe(dst, src net.Conn, up bool) {
	defer p.wg.Done()
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
			if up {
				p.sent(int64(n))
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
	src.Close()
	dst.Close()
}

func (p *proxy) sent(n int64) {
	p.mu.Lock()
	p.up += n
	cut := p.cutEvery > 0 && p.up >= p.nextCut
	if cut {
		p.nextCut = p.up + p.cutEvery
	}
	p.mu.Unlock()
	if cut {
		p.cut()
	}
}

// cut closes every current connection abruptly, both sides.
func (p *proxy) cut() {
	p.mu.Lock()
	var all []net.Conn
	for c := range p.conns {
		all = append(all, c)
	}
	p.mu.Unlock()
	if p.reset(all...) {
		p.cuts.Add(1)
	}
}

// reset closes those of conns that are still open abruptly (RST, not FIN);
// it reports whether any was.
func (p *proxy) reset(conns ...net.Conn) bool {
	open := false
	for _, c := range conns {
		p.mu.Lock()
		_, ok := p.conns[c]
		delete(p.conns, c)
		p.mu.Unlock()
		if !ok {
			continue
		}
		open = true
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // RST, not FIN
		}
		c.Close()
	}
	return open
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cut()
	p.wg.Wait()
}

// TestAgentDeliversExactlyOnceStoredThroughConnectionCuts sends 20,000
// events while a proxy between the agent and the server cuts every
// connection after each 200 KB sent. The server must store each event
// exactly once and the outbox must end empty.
func TestAgentDeliversExactlyOnceStoredThroughConnectionCuts(t *testing.T) {
	srv := startServer(t, server.Config{})
	px := newProxy(t, srv.addr, 200<<10)
	relay := fastRelay
	relay.BatchSize, relay.MaxInFlight = 128, 512 // a window well under one cut's worth of bytes
	ta := startAgent(t, agent.Config{Server: "ws://" + px.addr(), Relay: relay, AckTimeout: 5 * time.Second})

	const n, per = 20_000, 500
	var ids []string
	for i := 0; i < n; i += per {
		ids = append(ids, ta.postBatch(t, smallEvents(per, i))...)
	}
	cutsWhilePosting := px.cuts.Load()
	testenv.Eventually(t, 150*time.Second, "all events at the server and an empty outbox", func() bool {
		return srv.has(t, n) && ta.empty(t)
	})
	got, distinct, deliveries := srv.stored(t)
	if got != n || distinct != n {
		t.Fatalf("server holds %d events, %d distinct; want %d each", got, distinct, n)
	}
	stored := srv.ids(t)
	for _, id := range ids {
		if _, ok := stored[id]; !ok {
			t.Fatalf("event %s is missing at the server", id)
		}
	}
	if cuts := px.cuts.Load(); cuts < 10 {
		t.Fatalf("the proxy cut the connection only %d times; the test wants at least 10 cuts mid-stream", cuts)
	}
	t.Logf("%d cuts (%d while the producer was still posting); %d deliveries for %d events: %d duplicates acknowledged again",
		px.cuts.Load(), cutsWhilePosting, deliveries, got, deliveries-got)
}

func TestAgentQueuesWhileServerIsDown(t *testing.T) {
	// Take a free port and release it: nothing listens there until the
	// server starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ta := startAgent(t, agent.Config{Server: "ws://" + addr})
	const n, per = 300, 100
	var ids []string
	for i := 0; i < n; i += per {
		ids = append(ids, ta.postBatch(t, smallEvents(per, i))...)
	}
	if p, r := ta.counts(t); p != n || r != 0 {
		t.Fatalf("with the server down the outbox holds %d pending, %d rejected; want %d pending", p, r, n)
	}

	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s for the server: %v", addr, err)
	}
	srv := startServer(t, server.Config{Listener: ln})
	testenv.Eventually(t, 60*time.Second, "all events at the server and an empty outbox", func() bool {
		return srv.has(t, n) && ta.empty(t)
	})
	stored := srv.ids(t)
	for _, id := range ids {
		if _, ok := stored[id]; !ok {
			t.Fatalf("event %s is missing at the server", id)
		}
	}
	if got, distinct, _ := srv.stored(t); got != n || distinct != n {
		t.Fatalf("server holds %d events, %d distinct; want %d", got, distinct, n)
	}
}

// TestAgentKeepsRejectedEventAndRequeuesIt: the server refuses one event
// as too large; the agent keeps it as rejected with the reason and
// delivers the rest. After the server restarts with a larger limit, a
// requeue delivers it.
func TestAgentKeepsRejectedEventAndRequeuesIt(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "postbox.db")
	srv1 := startServer(t, server.Config{DBPath: dbPath, Limits: postbox.Limits{MaxEnvelopeBytes: 2048}})
	px := newProxy(t, srv1.addr, 0)
	ta := startAgent(t, agent.Config{Server: "ws://" + px.addr(), Limits: postbox.Limits{MaxEnvelopeBytes: 1 << 20}})

	big := strings.Repeat("x", 4000)
	events := smallEvents(10, 0)
	events = append(events[:5], append([]string{`{"event_id":"evt-big","type":"camera.frame","payload":{"data":"` + big + `"}}`}, events[5:]...)...)
	ids := ta.postBatch(t, events)

	testenv.Eventually(t, 30*time.Second, "the small events delivered and the big one rejected", func() bool {
		if !srv1.has(t, 10) {
			return false
		}
		p, r := ta.counts(t)
		return p == 0 && r == 1
	})
	rows, err := ta.a.Store().List(context.Background(), outboxsqlite.StateRejected, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].EventID != "evt-big" || rows[0].Attempts != 1 ||
		!strings.Contains(rows[0].LastError, "too_large") || !strings.Contains(rows[0].LastError, "2048") {
		t.Fatalf("rejected rows: %+v; want evt-big with the server's too_large reason", rows)
	}
	stored := srv1.ids(t)
	for _, id := range ids {
		if _, ok := stored[id]; ok != (id != "evt-big") {
			t.Fatalf("event %s stored=%v", id, ok)
		}
	}

	srv1.stop()
	srv2 := startServer(t, server.Config{DBPath: dbPath}) // default limit: 256 KiB
	px.setTarget(srv2.addr)
	px.cut() // connections to the stopped server
	n, err := ta.a.Store().Requeue(context.Background(), nil)
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1", n, err)
	}
	testenv.Eventually(t, 30*time.Second, "the requeued event at the server and an empty outbox", func() bool {
		return srv2.has(t, 11) && ta.empty(t)
	})
	if p := srv2.ids(t)["evt-big"]; p != `{"data":"`+big+`"}` {
		t.Fatalf("stored payload of evt-big: %d bytes, want the %d-byte original", len(p), len(big)+11)
	}
	if got, distinct, _ := srv2.stored(t); got != 11 || distinct != 11 {
		t.Fatalf("server holds %d events, %d distinct; want 11", got, distinct)
	}
}

// TestAgentOverTLSWithItsOwnCA: an agent given the server's self-signed
// certificate (--ca-cert) delivers over wss:// with a bearer token.
func TestAgentOverTLSWithItsOwnCA(t *testing.T) {
	certPath, keyPath, _ := servertest.SelfSignedCert(t, t.TempDir())
	tokens := ingress.Tokens{}
	tokens.Add("secret-of-dev-1", device)
	srv := startServer(t, server.Config{TLSCert: certPath, TLSKey: keyPath, Tokens: tokens})
	ta := startAgent(t, agent.Config{Server: "wss://" + srv.addr, CACert: certPath, Token: "secret-of-dev-1"})
	ta.postBatch(t, smallEvents(20, 0))
	testenv.Eventually(t, 30*time.Second, "the events at the server over TLS", func() bool {
		return srv.has(t, 20) && ta.empty(t)
	})
	if _, err := agent.New(agent.Config{Server: "wss://" + srv.addr, CACert: keyPath, DeviceID: device, OutboxPath: filepath.Join(t.TempDir(), "o.db")}); err == nil ||
		!strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a --ca-cert without a certificate: got %v", err)
	}
}

// TestOutboxUsedByOneAgentOnly: a second agent on the same outbox is
// refused instead of sending every row twice.
func TestOutboxUsedByOneAgentOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "outbox.db")
	startAgent(t, agent.Config{Server: "ws://127.0.0.1:1", OutboxPath: path})
	_, err := agent.New(agent.Config{Server: "ws://127.0.0.1:1", OutboxPath: path, DeviceID: device, Listen: "127.0.0.1:0"})
	if pid := fmt.Sprintf("(pid %d)", os.Getpid()); !errors.Is(err, sqlitedb.ErrLocked) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), pid) {
		t.Fatalf("second agent on one outbox: got %v, want %v naming the outbox and %s", err, sqlitedb.ErrLocked, pid)
	}
}

// TestIntakeNoRoute: what the intake has no route for is a JSON 404, a
// method a path does not take a JSON 405 with Allow, and a body that is
// no event is named so, not as a WebSocket frame.
func TestIntakeNoRoute(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable})
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/v1/nosuch", 404, "not_found", ""},
		{"PUT", "/v1/events", 405, "method_not_allowed", "POST"},
		{"POST", "/health", 405, "method_not_allowed", "GET, HEAD"},
	} {
		req, _ := http.NewRequest(c.method, ta.url+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || !strings.Contains(string(body), `"code":"`+c.code+`"`) {
			t.Errorf("%s %s: %s Allow %q %s, want %d %s Allow %q", c.method, c.path, resp.Status, resp.Header.Get("Allow"), body, c.status, c.code, c.allow)
		}
	}
	if status, body := ta.post(t, `"a string"`); status != 400 || !strings.Contains(string(body), "the body must be an event object") {
		t.Errorf("a string for a body: %d %s", status, body)
	}
}

// TestIntakeSlowBodyIsCutOff: a body that does not arrive within
// ReadTimeout is answered 408 request_timeout, and the connection closed,
// instead of holding the intake's handler for ever.
func TestIntakeSlowBodyIsCutOff(t *testing.T) {
	ta := startAgent(t, agent.Config{Server: unreachable, ReadTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", strings.TrimPrefix(ta.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/events HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ty")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a body that never ends: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), `"request_timeout"`) {
		t.Fatalf("a slow body: %s %s, want 408 request_timeout", resp.Status, body)
	}
}

// TestNewRefusesBadConfigBeforeTheOutbox: what the agent cannot run with
// is refused by New, naming it, before the outbox file (or its lock) is
// created.
func TestNewRefusesBadConfigBeforeTheOutbox(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, c := range []struct {
		name string
		cfg  agent.Config
		want string
	}{
		{"synchronous", agent.Config{Synchronous: "OFF"}, `synchronous must be FULL or NORMAL, not "OFF"`},
		{"listen", agent.Config{Listen: "bogus"}, "listen bogus"},
		{"listen taken", agent.Config{Listen: taken.Addr().String()}, "address already in use"},
		{"device id", agent.Config{DeviceID: " dev-1"}, "device_id: begins or ends with white space"},
		{"session id", agent.Config{SessionID: "s\x01"}, "session_id: contains a control character"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			c.cfg.Server = "ws://127.0.0.1:1"
			c.cfg.OutboxPath = filepath.Join(dir, "outbox.db")
			if c.cfg.DeviceID == "" {
				c.cfg.DeviceID = device
			}
			if c.cfg.Listen == "" {
				c.cfg.Listen = "127.0.0.1:0"
			}
			_, err := agent.New(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error saying %q", err, c.want)
			}
			if files, _ := os.ReadDir(dir); len(files) != 0 {
				t.Errorf("New left %d files behind (%s...)", len(files), files[0].Name())
			}
		})
	}
}

// TestPayloadBytesKept: a payload full of '<', '>' and '&' reaches the
// server as it was posted; json.Marshal's escapes once made such an event
// six times larger on the wire, over the server's limit after a 202.
func TestPayloadBytesKept(t *testing.T) {
	srv := startServer(t, server.Config{})
	ta := startAgent(t, agent.Config{Server: "ws://" + srv.addr})
	payload := `{"html":"` + strings.Repeat("<b>&", 20000) + `"}` // 80 KB, 480 KB escaped
	st, body := ta.post(t, `{"event_id":"evt_html","type":"page","payload":`+payload+`}`)
	if st != http.StatusAccepted {
		t.Fatalf("POST: %d %s", st, body)
	}
	testenv.Eventually(t, 30*time.Second, "the event at the server and its row gone", func() bool {
		if _, rejected := ta.counts(t); rejected != 0 {
			t.Fatalf("the event was rejected: %s", ta.rows(t)["evt_html"].LastError)
		}
		return srv.has(t, 1) && ta.empty(t)
	})
	if got := srv.ids(t)["evt_html"]; got != payload {
		t.Errorf("stored payload of %d bytes (%.40q...), want the %d bytes posted", len(got), got, len(payload))
	}
}
