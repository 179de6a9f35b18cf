package ingress_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/api"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/ingresspb"
	"github.com/postbox-events/postbox/internal/intakerate"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// frameConn is one connection to an ingress, over either transport: it
// sends raw frames (what a WebSocket message or an ingresspb.Frame holds)
// and reads the server's replies as they come.
type frameConn interface {
	// Send writes one frame.
	Send(ctx context.Context, frame []byte) error
	// Replies returns the replies of the server's next message, or the
	// error that ended the connection.
	Replies(ctx context.Context) ([]postbox.Reply, error)
	// Drained reports whether err, from Replies, is the close of a
	// connection drained at shutdown.
	Drained(err error) bool
	Close()
}

// transport serves an ingress over one transport for a test and dials it.
type transport struct {
	name string
	// serve serves in until the test ends and returns the URL client.Dial
	// takes; dial connects to it with a bearer token (none when empty),
	// failing the test on an error other than a refusal of the token,
	// which it returns.
	serve func(t *testing.T, in *ingress.Ingress) (url string, dial func(t *testing.T, token string) (frameConn, error))
}

// errUnauthorized is a dial refused for its token.
var errUnauthorized = errors.New("unauthorized")

// errTooMany is a dial refused at a connection limit.
var errTooMany = errors.New("too many connections")

var transports = []transport{
	{name: "websocket", serve: func(t *testing.T, in *ingress.Ingress) (string, func(*testing.T, string) (frameConn, error)) {
		hs := httptest.NewServer(in)
		t.Cleanup(hs.Close)
		url := "ws" + strings.TrimPrefix(hs.URL, "http")
		return url, func(t *testing.T, token string) (frameConn, error) {
			opts := &websocket.DialOptions{}
			if token != "" {
				opts.HTTPHeader = map[string][]string{"Authorization": {"Bearer " + token}}
			}
			c, resp, err := websocket.Dial(testCtx(t), url, opts)
			if resp != nil && resp.StatusCode == 401 {
				return nil, errUnauthorized
			}
			if resp != nil && resp.StatusCode == 503 {
				var body api.ErrorResponse
				if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != api.CodeTooManyConnections ||
					resp.Header.Get("Retry-After") == "" {
					t.Errorf("refusal: %v %+v, Retry-After %q; want a too_many_connections error and a Retry-After", err, body, resp.Header.Get("Retry-After"))
				}
				t.Logf("refused: %s", body.Error.Message)
				return nil, errTooMany
			}
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			c.SetReadLimit(64 << 20)
			t.Cleanup(func() { c.CloseNow() })
			return wsConn{c}, nil
		}
	}},
	{name: "grpc", serve: func(t *testing.T, in *ingress.Ingress) (string, func(*testing.T, string) (frameConn, error)) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer(in.ServerOptions()...)
		ingresspb.RegisterIngressServer(gs, in.GRPC())
		go gs.Serve(ln)
		t.Cleanup(gs.Stop)
		return "grpc://" + ln.Addr().String(), func(t *testing.T, token string) (frameConn, error) {
			cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			if token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
			}
			s, err := ingresspb.NewIngressClient(cc).Send(ctx)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			if md, _ := s.Header(); md == nil { // refused: a status without headers
				_, err := s.Recv()
				switch status.Code(err) {
				case codes.Unauthenticated:
					return nil, errUnauthorized
				case codes.ResourceExhausted:
					return nil, errTooMany
				}
				t.Fatalf("dial: %v", err)
			}
			return grpcConn{s, cancel}, nil
		}
	}},
}

type wsConn struct{ c *websocket.Conn }

func (w wsConn) Send(ctx context.Context, frame []byte) error {
	return w.c.Write(ctx, websocket.MessageText, frame)
}

func (w wsConn) Replies(ctx context.Context) ([]postbox.Reply, error) {
	_, data, err := w.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	return postbox.DecodeReplies(data)
}

func (w wsConn) Drained(err error) bool {
	return websocket.CloseStatus(err) == websocket.StatusGoingAway
}
func (w wsConn) Close() { w.c.Close(websocket.StatusNormalClosure, "") }

type grpcConn struct {
	s      ingresspb.Ingress_SendClient
	cancel context.CancelFunc
}

func (g grpcConn) Send(_ context.Context, frame []byte) error {
	return g.s.Send(&ingresspb.Frame{Envelopes: frame})
}

func (g grpcConn) Replies(context.Context) ([]postbox.Reply, error) {
	m, err := g.s.Recv()
	if err != nil {
		return nil, err
	}
	return m.Postbox(), nil
}

func (g grpcConn) Drained(err error) bool { return status.Code(err) == codes.Unavailable }
func (g grpcConn) Close()                 { g.cancel() }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// send writes frame on c, failing the test if it cannot.
func send(t *testing.T, c frameConn, frame []byte) {
	t.Helper()
	if err := c.Send(testCtx(t), frame); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// has reports whether the store holds an event with id.
func (s *store) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stored[id]
}

// replies reads until n replies arrived, failing the test if the
// connection ends first.
func replies(t *testing.T, c frameConn, n int) []postbox.Reply {
	t.Helper()
	var out []postbox.Reply
	for len(out) < n {
		rs, err := c.Replies(testCtx(t))
		if err != nil {
			t.Fatalf("after %d of %d replies: %v", len(out), n, err)
		}
		out = append(out, rs...)
	}
	if len(out) != n {
		t.Fatalf("%d replies, want %d: %+v", len(out), n, out)
	}
	return out
}

// byID indexes replies by event id, failing on a second reply to one id.
func byID(t *testing.T, rs []postbox.Reply) map[string]postbox.Reply {
	t.Helper()
	m := make(map[string]postbox.Reply, len(rs))
	for _, r := range rs {
		if _, ok := m[r.EventID]; ok {
			t.Fatalf("two replies to %q", r.EventID)
		}
		m[r.EventID] = r
	}
	return m
}

// env returns an envelope as JSON.
func env(id, device, typ, payload string) string {
	return fmt.Sprintf(`{"schema_version":1,"event_id":%q,"type":%q,"ts":"2026-02-16T23:10:21Z","session_id":"s","device_id":%q,"payload":%s}`,
		id, typ, device, payload)
}

// frame returns envelopes as one frame (an array).
func frame(envs ...string) []byte { return []byte("[" + strings.Join(envs, ",") + "]") }

// sqliteStore opens a SQLite stream backend with its writer running.
func sqliteStore(t *testing.T) *streamsqlite.Backend {
	t.Helper()
	b, err := streamsqlite.Open(filepath.Join(t.TempDir(), "postbox.db"), streamsqlite.Config{Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		b.Close()
	})
	if _, err := b.EnsureStream(context.Background(), "devices"); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTransports runs every ingress behaviour over the WebSocket and over
// gRPC: ACK after commit, duplicates, conflicts, bad input, device tokens,
// backpressure and shutdown.
func TestTransports(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Run("ack after commit", func(t *testing.T) { testAckAfterCommit(t, tr) })
			t.Run("stored once", func(t *testing.T) { testStoredOnce(t, tr) })
			t.Run("bad input", func(t *testing.T) { testBadInput(t, tr) })
			t.Run("tokens", func(t *testing.T) { testTokens(t, tr) })
			t.Run("token rate", func(t *testing.T) { testTokenRate(t, tr) })
			t.Run("backpressure", func(t *testing.T) { testBackpressure(t, tr) })
			t.Run("shutdown", func(t *testing.T) { testShutdown(t, tr) })
			t.Run("client", func(t *testing.T) { testClient(t, tr) })
			t.Run("source gone", func(t *testing.T) { testSourceGone(t, tr) })
			t.Run("connections per address", func(t *testing.T) { testPerAddress(t, tr) })
		})
	}
}

// newIngress returns an ingress of the "devices" stream over st.
func newIngress(t *testing.T, st ingress.Appender, cfg ingress.Config) *ingress.Ingress {
	t.Helper()
	cfg.StreamID = "devices"
	in, err := ingress.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func dialOK(t *testing.T, dial func(*testing.T, string) (frameConn, error), token string) frameConn {
	t.Helper()
	c, err := dial(t, token)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return c
}

// testAckAfterCommit: no reply comes while the store has not committed;
// every envelope is ACKed once it has, and a pipelined frame too.
func testAckAfterCommit(t *testing.T, tr transport) {
	st := newStore()
	st.hold()
	in := newIngress(t, st, ingress.Config{})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	send(t, c, frame(env("a-1", "pi-1", "t", `{"n":1}`), env("a-2", "pi-1", "t", `{"n":2}`)))
	send(t, c, []byte(env("a-3", "pi-1", "t", `{"n":3}`))) // a frame of one object, pipelined
	got := make(chan []postbox.Reply, 1)
	go func() {
		var out []postbox.Reply
		for len(out) < 3 {
			rs, err := c.Replies(context.Background())
			if err != nil {
				break
			}
			out = append(out, rs...)
		}
		got <- out
	}()
	testenv.Eventually(t, 10*time.Second, "the store to be asked to append", func() bool { return st.waiters() > 0 })
	select {
	case rs := <-got:
		t.Fatalf("replies before the commit: %+v", rs)
	default:
	}
	st.letGo()
	rs := byID(t, <-got)
	for _, id := range []string{"a-1", "a-2", "a-3"} {
		if r := rs[id]; !r.OK() || r.Duplicate || r.AckTS == "" {
			t.Errorf("%s: %+v, want a new ACK", id, r)
		}
		if !st.has(id) {
			t.Errorf("%s ACKed and not stored", id)
		}
	}
}

// testStoredOnce: on a real store, a redelivery is a duplicate ACK with
// the first ack_ts, another payload or type a conflict naming the field,
// and two devices' events with one event_id are both stored.
func testStoredOnce(t *testing.T, tr transport) {
	in := newIngress(t, sqliteStore(t), ingress.Config{})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	send(t, c, frame(env("d-1", "pi-1", "t", `{"n":1}`)))
	first := replies(t, c, 1)[0]
	if !first.OK() || first.Duplicate {
		t.Fatalf("first delivery: %+v", first)
	}
	send(t, c, frame(env("d-1", "pi-1", "t", `{ "n" : 1 }`))) // the same payload but for white space
	if r := replies(t, c, 1)[0]; !r.OK() || !r.Duplicate || r.AckTS != first.AckTS {
		t.Errorf("redelivery: %+v, want a duplicate ACK with ack_ts %s", r, first.AckTS)
	}
	send(t, c, frame(env("d-1", "pi-1", "t", `{"n":2}`)))
	if r := replies(t, c, 1)[0]; r.Code != postbox.CodeConflict || r.Field != "payload" || r.Retryable {
		t.Errorf("another payload: %+v, want a conflict on payload", r)
	}
	send(t, c, frame(env("d-1", "pi-1", "u", `{"n":1}`)))
	if r := replies(t, c, 1)[0]; r.Code != postbox.CodeConflict || r.Field != "type" {
		t.Errorf("another type: %+v, want a conflict on type", r)
	}
	send(t, c, frame(env("d-1", "pi-2", "t", `{"n":1}`)))
	if r := replies(t, c, 1)[0]; !r.OK() || r.Duplicate {
		t.Errorf("another device's d-1: %+v, want a new ACK", r)
	}
}

// testBadInput: every refusal is one NACK with its code and field, a
// frame's valid envelopes are stored beside its refused ones, and the
// connection stays usable.
func testBadInput(t *testing.T, tr transport) {
	st := newStore()
	close(st.full)
	in := newIngress(t, st, ingress.Config{Limits: postbox.Limits{MaxEnvelopeBytes: 1024}})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	for _, tc := range []struct {
		name  string
		frame string
		id    string
		code  postbox.Code
		field string
	}{
		{"not json", `not json`, "", postbox.CodeInvalidJSON, ""},
		{"empty array", `[]`, "", postbox.CodeInvalidJSON, ""},
		{"missing type", strings.Replace(env("b-1", "pi-1", "t", `{}`), `"type":"t",`, "", 1), "b-1", postbox.CodeMissingField, "type"},
		{"unknown field", strings.Replace(env("b-2", "pi-1", "t", `{}`), `{`, `{"extra":1,`, 1), "b-2", postbox.CodeUnknownField, "extra"},
		{"bad ts", strings.Replace(env("b-3", "pi-1", "t", `{}`), "2026-02-16T23:10:21Z", "yesterday", 1), "b-3", postbox.CodeInvalidField, "ts"},
		{"version", strings.Replace(env("b-4", "pi-1", "t", `{}`), `"schema_version":1`, `"schema_version":2`, 1), "b-4", postbox.CodeUnsupportedVersion, ""},
		{"too large", env("b-5", "pi-1", "t", `{"x":"`+strings.Repeat("x", 2048)+`"}`), "b-5", postbox.CodeTooLarge, ""},
		// An id over the limit is named back while it is short enough to
		// match; a longer one is not copied into the reply.
		{"long id", env(strings.Repeat("i", 200), "pi-1", "t", `{}`), strings.Repeat("i", 200), postbox.CodeInvalidField, "event_id"},
		{"huge id", env(strings.Repeat("i", 1100), "pi-1", "t", `{}`), "", postbox.CodeTooLarge, ""},
	} {
		send(t, c, []byte(tc.frame))
		r := replies(t, c, 1)[0]
		if r.EventID != tc.id || r.OK() || r.Code != tc.code || r.Retryable || (tc.field != "" && r.Field != tc.field) {
			t.Errorf("%s: %+v, want a NACK %s of %q naming %q", tc.name, r, tc.code, tc.id, tc.field)
		}
	}
	send(t, c, frame(env("b-ok", "pi-1", "t", `{}`), `{"event_id":"b-bad"}`))
	rs := byID(t, replies(t, c, 2))
	if !rs["b-ok"].OK() || rs["b-bad"].Code != postbox.CodeMissingField {
		t.Errorf("a frame of a valid and an invalid envelope: %+v", rs)
	}
}

// testTokens: an unknown token is refused, and a token sends only for its
// device.
func testTokens(t *testing.T, tr transport) {
	st := newStore()
	close(st.full)
	tokens := ingress.Tokens{}
	tokens.Add("tok-a", "pi-a")
	_, dial := tr.serve(t, newIngress(t, st, ingress.Config{Tokens: tokens}))
	for _, token := range []string{"", "tok-x"} {
		if _, err := dial(t, token); !errors.Is(err, errUnauthorized) {
			t.Errorf("token %q: dial error %v, want a refusal", token, err)
		}
	}
	c := dialOK(t, dial, "tok-a")
	send(t, c, frame(env("k-1", "pi-a", "t", `{}`), env("k-2", "pi-b", "t", `{}`)))
	rs := byID(t, replies(t, c, 2))
	if !rs["k-1"].OK() || rs["k-2"].Code != postbox.CodeForbidden || rs["k-2"].Field != "device_id" {
		t.Errorf("replies %+v, want k-1 ACKed and k-2 forbidden", rs)
	}
}

// testTokenRate: a device token over its rate (TokenRate) is held, not
// refused: 30 envelopes at 40/s burst 10 are all ACKed, no sooner than
// the 20 beyond the burst allow (0.5 s); another token has its own
// budget.
func testTokenRate(t *testing.T, tr transport) {
	st := newStore()
	close(st.full)
	tokens := ingress.Tokens{}
	tokens.Add("tok-a", "pi-a")
	tokens.Add("tok-b", "pi-b")
	_, dial := tr.serve(t, newIngress(t, st, ingress.Config{Tokens: tokens, TokenRate: intakerate.Rate{PerSecond: 40, Burst: 10}}))
	a := dialOK(t, dial, "tok-a")
	start := time.Now()
	for f := range 3 {
		var envs []string
		for i := range 10 {
			envs = append(envs, env(fmt.Sprintf("a-%d-%d", f, i), "pi-a", "t", `{}`))
		}
		send(t, a, frame(envs...))
	}
	for id, r := range byID(t, replies(t, a, 30)) {
		if !r.OK() {
			t.Fatalf("%s: %+v, want every envelope ACKed", id, r)
		}
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Fatalf("30 envelopes at 40/s burst 10 answered in %v, want at least 0.5s", took)
	}
	b := dialOK(t, dial, "tok-b")
	start = time.Now()
	var envs []string
	for i := range 10 {
		envs = append(envs, env(fmt.Sprintf("b-%d", i), "pi-b", "t", `{}`))
	}
	send(t, b, frame(envs...))
	replies(t, b, 10)
	if took := time.Since(start); took > 300*time.Millisecond {
		t.Fatalf("another token's burst took %v: it waited on the first's budget", took)
	}
}

// testBackpressure: while the store's queue is full the ingress reads no
// more than MaxInFlight envelopes of a connection that pipelines, and
// once it has room every envelope is answered exactly once.
func testBackpressure(t *testing.T, tr transport) {
	const frames, perFrame, maxInFlight = 40, 5, 10
	st := newStore()
	st.hold()
	reg := prometheus.NewRegistry()
	in := newIngress(t, st, ingress.Config{MaxInFlight: maxInFlight, Metrics: ingress.NewMetrics(reg)})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for f := range frames {
			envs := make([]string, perFrame)
			for i := range envs {
				envs[i] = env(fmt.Sprintf("p-%02d-%d", f, i), "pi-1", "t", `{"n":1}`)
			}
			if err := c.Send(context.Background(), frame(envs...)); err != nil {
				t.Errorf("send: %v", err)
				return
			}
		}
	}()
	testenv.Eventually(t, 10*time.Second, "the ingress to stop reading", func() bool {
		return metric(t, reg, "postbox_ingress_frames_total") == maxInFlight/perFrame && st.waiters() > 0
	})
	// Held: the reader waits for answers, so it reads no further frame
	// however long the queue stays full. The store is asked again below,
	// after the last check.
	for range 3 {
		if st.waiters() == 0 {
			t.Fatal("the store stopped waiting")
		}
		if n := metric(t, reg, "postbox_ingress_frames_total"); n != maxInFlight/perFrame {
			t.Fatalf("%v frames read while %d envelopes were unanswered, want %d", n, maxInFlight, maxInFlight/perFrame)
		}
		time.Sleep(20 * time.Millisecond) // a window in which a read would show: nothing is awaited
	}
	if n := metric(t, reg, "postbox_ingress_saturated"); n != 1 {
		t.Errorf("postbox_ingress_saturated is %v while the connection waits for room in the queue, want 1", n)
	}
	st.letGo()
	rs := byID(t, replies(t, c, frames*perFrame))
	<-sent
	if n := metric(t, reg, "postbox_ingress_saturated"); n != 0 {
		t.Errorf("postbox_ingress_saturated is %v once the queue has room, want 0", n)
	}
	if s := metric(t, reg, "postbox_ingress_saturated_seconds_total"); s < 0.05 {
		t.Errorf("postbox_ingress_saturated_seconds_total is %v after waiting over 60 ms for room", s)
	}
	for id, r := range rs {
		if !r.OK() {
			t.Errorf("%s: %+v", id, r)
		}
	}
}

// testShutdown: at Drain a frame read before is answered once the store
// commits, a frame read after gets retryable outage NACKs, and the
// connection closes as drained.
func testShutdown(t *testing.T, tr transport) {
	st := newStore()
	st.hold()
	in := newIngress(t, st, ingress.Config{})
	_, dial := tr.serve(t, in)
	c := dialOK(t, dial, "")
	send(t, c, frame(env("s-1", "pi-1", "t", `{}`), env("s-2", "pi-1", "t", `{}`)))
	testenv.Eventually(t, 10*time.Second, "the store to be asked to append", func() bool { return st.waiters() > 0 })
	begun, cancel := context.WithCancel(context.Background())
	cancel()
	in.Drain(begun) // begins the drain, without waiting
	send(t, c, frame(env("s-3", "pi-1", "t", `{}`)))
	r := replies(t, c, 1)[0]
	if r.EventID != "s-3" || r.Code != postbox.CodeOutage || !r.Retryable {
		t.Fatalf("a frame read after the drain began: %+v, want a retryable outage NACK of s-3", r)
	}
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		drained <- in.Drain(ctx)
	}()
	st.letGo()
	rs := byID(t, replies(t, c, 2))
	if !rs["s-1"].OK() || !rs["s-2"].OK() {
		t.Errorf("frames read before the drain: %+v, want ACKs", rs)
	}
	_, err := c.Replies(testCtx(t))
	if !c.Drained(err) {
		t.Errorf("after the answers the connection ended with %v, want a drained close", err)
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain: %v", err)
	}
}

// testClient: the client package speaks the transport by its URL, and
// says a refused token is ErrUnauthorized.
func testClient(t *testing.T, tr transport) {
	st := newStore()
	close(st.full)
	tokens := ingress.Tokens{}
	tokens.Add("tok-a", "pi-a")
	url, _ := tr.serve(t, newIngress(t, st, ingress.Config{Tokens: tokens}))
	if _, err := client.Dial(testCtx(t), url, client.Options{Token: "tok-x"}); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("Dial with an unknown token: %v, want ErrUnauthorized", err)
	}
	c, err := client.Dial(testCtx(t), url, client.Options{Token: "tok-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rs, err := c.Send(testCtx(t), msgs(t, "c", "pi-a", 100))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if want := fmt.Sprintf("c-%03d", i); !r.OK() || r.EventID != want {
			t.Errorf("reply %d: %+v, want an ACK of %s", i, r, want)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := c.Send(testCtx(t), msgs(t, "d", "pi-a", 1)); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
}

// testPerAddress: one address holds at most MaxConnectionsPerAddress
// connections without a token, and gets one more once it closes one;
// connections with device tokens are not counted (each device holds one).
func testPerAddress(t *testing.T, tr transport) {
	st := newStore()
	close(st.full)
	_, dial := tr.serve(t, newIngress(t, st, ingress.Config{MaxConnectionsPerAddress: 2}))
	first := dialOK(t, dial, "")
	dialOK(t, dial, "")
	if _, err := dial(t, ""); !errors.Is(err, errTooMany) {
		t.Fatalf("third connection from one address: %v, want it refused", err)
	}
	first.Close()
	testenv.Eventually(t, 10*time.Second, "a closed connection to make room for its address", func() bool {
		_, err := dial(t, "")
		return err == nil
	})

	tokens := ingress.Tokens{}
	for _, d := range []string{"pi-a", "pi-b", "pi-c"} {
		tokens.Add("tok-"+d, d)
	}
	_, dial = tr.serve(t, newIngress(t, st, ingress.Config{Tokens: tokens, MaxConnectionsPerAddress: 1}))
	for _, d := range []string{"pi-a", "pi-b", "pi-c"} {
		c := dialOK(t, dial, "tok-"+d)
		send(t, c, frame(env("pa-"+d, d, "t", `{}`)))
		if rs := replies(t, c, 1); !rs[0].OK() {
			t.Errorf("device %s behind one address: %+v, want its event stored", d, rs[0])
		}
	}
}
