package outboxnats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxnats"
	"github.com/postbox-events/postbox/outbox/outboxsqlite"
	"github.com/postbox-events/postbox/retry"
)

// connect returns a JetStream context on a new connection to url, closed
// when the test ends.
func connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

var streamSeq atomic.Int64

// newStream creates a stream of its own for the test, on subjects
// "<name>.>", deleted when the test ends. It is created and deleted on a
// connection of its own, so a test may close or break the publisher's.
func newStream(t testing.TB, edit func(*jetstream.StreamConfig)) (url, name string, s jetstream.Stream) {
	t.Helper()
	url = testenv.URL(t, testenv.NATS)
	_, admin := connect(t, url)
	name = fmt.Sprintf("OUTBOXNATS_%d_%d", time.Now().UnixNano(), streamSeq.Add(1))
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}
	if edit != nil {
		edit(&cfg)
	}
	ctx := context.Background()
	s, err := admin.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		if err := admin.DeleteStream(context.Background(), name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return url, name, s
}

func newPublisher(t testing.TB, js jetstream.JetStream, cfg outboxnats.Config) *outboxnats.Publisher {
	t.Helper()
	p, err := outboxnats.NewPublisher(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func message(id, typ string, body string) outbox.Message {
	return outbox.Message{EventID: id, Type: typ, Body: []byte(body)}
}

func messages(prefix string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		id := fmt.Sprintf("%s-%05d", prefix, i)
		msgs[i] = message(id, "test.event", `{"id":"`+id+`"}`)
	}
	return msgs
}

func publish(t testing.TB, p *outboxnats.Publisher, msgs []outbox.Message) []postbox.Reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	replies, err := p.Publish(ctx, msgs)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if len(replies) != len(msgs) {
		t.Fatalf("%d replies to %d messages", len(replies), len(msgs))
	}
	return replies
}

func streamMsgs(t testing.TB, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func getMsg(t testing.TB, s jetstream.Stream, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatalf("get message %d: %v", seq, err)
	}
	return m
}

// eventually polls cond until it holds, failing the test after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		<-tick.C
	}
}

func TestNewPublisherChecksConfig(t *testing.T) {
	_, js := func() (*nats.Conn, jetstream.JetStream) {
		nc := &nats.Conn{} // never used: the constructor only checks
		js, _ := jetstream.New(nc)
		return nc, js
	}()
	for _, cfg := range []outboxnats.Config{
		{},
		{Stream: "a.b"},
		{Stream: "a b"},
		{Stream: "S", SubjectPrefix: "s.*"},
		{Stream: "S", SubjectPrefix: "s..x"},
		{Stream: "S", Duplicates: -time.Second},
	} {
		if _, err := outboxnats.NewPublisher(js, cfg); err == nil {
			t.Errorf("NewPublisher(%+v) accepted it", cfg)
		}
	}
	if _, err := outboxnats.NewPublisher(nil, outboxnats.Config{Stream: "S"}); err == nil {
		t.Error("NewPublisher(nil) accepted it")
	}
	p, err := outboxnats.NewPublisher(js, outboxnats.Config{Stream: "ORDERS"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := p.Subject("order.created"); err != nil || s != "ORDERS.order.created" {
		t.Errorf("Subject(order.created) = %q, %v", s, err)
	}
}

func TestPublishHeadersDataSubject(t *testing.T) {
	url, name, s := newStream(t, nil)
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})

	created := time.Date(2030, 1, 2, 3, 4, 5, 678, time.FixedZone("x", 3600))
	full := outbox.Message{
		EventID: "evt_1", Type: "order.created", Body: []byte(`{"order":1}`),
		CorrelationID: "corr-1", TenantID: "tenant-1", CreatedAt: created,
	}
	bare := message("evt_2", "order.paid", `{"order":1,"paid":true}`)
	replies := publish(t, p, []outbox.Message{full, bare})
	for i, r := range replies {
		if !r.OK() || r.Duplicate || r.AckTS == "" {
			t.Errorf("reply %d: %+v, want a fresh ACK", i, r)
		}
	}
	if replies[0].EventID != "evt_1" || replies[1].EventID != "evt_2" {
		t.Errorf("reply ids %q, %q", replies[0].EventID, replies[1].EventID)
	}

	m := getMsg(t, s, 1)
	if m.Subject != name+".order.created" || string(m.Data) != `{"order":1}` {
		t.Errorf("message 1: subject %q data %s", m.Subject, m.Data)
	}
	want := map[string]string{
		jetstream.MsgIDHeader:          "evt_1",
		outboxnats.HeaderEventType:     "order.created",
		outboxnats.HeaderCorrelationID: "corr-1",
		outboxnats.HeaderTenantID:      "tenant-1",
		outboxnats.HeaderCreatedAt:     "2030-01-02T02:04:05.000000678Z",
	}
	for k, v := range want {
		if got := m.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	m = getMsg(t, s, 2)
	if m.Subject != name+".order.paid" || m.Header.Get(jetstream.MsgIDHeader) != "evt_2" {
		t.Errorf("message 2: subject %q, headers %v", m.Subject, m.Header)
	}
	for _, k := range []string{outboxnats.HeaderCorrelationID, outboxnats.HeaderTenantID, outboxnats.HeaderCreatedAt} {
		if v, ok := m.Header[k]; ok {
			t.Errorf("message 2 without that field has header %s: %q", k, v)
		}
	}
}

func TestPublishKeepsBatchOrder(t *testing.T) {
	url, name, s := newStream(t, nil)
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	msgs := messages("order", 1000)
	for i, r := range publish(t, p, msgs) {
		if !r.OK() {
			t.Fatalf("reply %d: %+v", i, r)
		}
	}
	if n := streamMsgs(t, s); n != uint64(len(msgs)) {
		t.Fatalf("stream holds %d messages, want %d", n, len(msgs))
	}
	for i, msg := range msgs {
		m := getMsg(t, s, uint64(i+1))
		if id := m.Header.Get(jetstream.MsgIDHeader); id != msg.EventID {
			t.Fatalf("sequence %d holds %s, want %s", i+1, id, msg.EventID)
		}
	}
}

func TestPublishDuplicateIsAckedOnce(t *testing.T) {
	url, name, s := newStream(t, nil)
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	msg := message("evt_dup", "test.event", `{"n":1}`)
	first := publish(t, p, []outbox.Message{msg})[0]
	second := publish(t, p, []outbox.Message{msg})[0]
	if !first.OK() || first.Duplicate {
		t.Errorf("first reply %+v, want a fresh ACK", first)
	}
	if !second.OK() || !second.Duplicate || second.EventID != "evt_dup" {
		t.Errorf("second reply %+v, want an ACK with Duplicate", second)
	}
	if n := streamMsgs(t, s); n != 1 {
		t.Errorf("stream holds %d messages, want 1", n)
	}
}

func TestPublishRefusesTypesThatAreNotSubjects(t *testing.T) {
	url, name, s := newStream(t, nil)
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	bad := []string{"", "order created", "order..created", ".order", "order.", "order.*", "order.>", "tab\tbed", "new\nline", "del\x7f"}
	msgs := []outbox.Message{message("evt_ok_1", "ok.first", `{}`)}
	for i, typ := range bad {
		msgs = append(msgs, message(fmt.Sprintf("evt_bad_%d", i), typ, `{}`))
	}
	msgs = append(msgs, message("evt_ok_2", "ok.second", `{}`))

	replies := publish(t, p, msgs)
	if !replies[0].OK() || !replies[len(replies)-1].OK() {
		t.Errorf("valid neighbours not ACKed: %+v, %+v", replies[0], replies[len(replies)-1])
	}
	for i, typ := range bad {
		r := replies[i+1]
		if r.OK() || r.Retryable || r.Code != postbox.CodeInvalidField || r.Field != "type" || r.EventID != msgs[i+1].EventID {
			t.Errorf("type %q: reply %+v, want a non-retryable invalid_field NACK of type", typ, r)
		}
		if !strings.Contains(r.Message, fmt.Sprintf("%q", typ)) {
			t.Errorf("type %q: message %q does not name it", typ, r.Message)
		}
	}
	if n := streamMsgs(t, s); n != 2 {
		t.Errorf("stream holds %d messages, want the 2 valid ones", n)
	}
	// Through the relay's eyes: parked, not retried.
	if o := outbox.ReplyOutcome(replies[1], time.Now()); o.Kind != outbox.Rejected {
		t.Errorf("outcome %+v, want Rejected", o)
	}
}

func TestPublishTooLarge(t *testing.T) {
	url, name, s := newStream(t, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 1024 })
	nc, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	overServer := message("evt_huge", "test.event", `"`+strings.Repeat("x", int(nc.MaxPayload()))+`"`)
	overStream := message("evt_big", "test.event", `"`+strings.Repeat("x", 2000)+`"`)
	msgs := []outbox.Message{message("evt_a", "test.event", `{}`), overServer, overStream, message("evt_b", "test.event", `{}`)}

	replies := publish(t, p, msgs)
	if !replies[0].OK() || !replies[3].OK() {
		t.Errorf("neighbours not ACKed: %+v, %+v", replies[0], replies[3])
	}
	for _, i := range []int{1, 2} {
		r := replies[i]
		if r.OK() || r.Retryable || r.Code != postbox.CodeTooLarge || r.EventID != msgs[i].EventID {
			t.Errorf("%s: reply %+v, want a non-retryable too_large NACK", msgs[i].EventID, r)
		}
	}
	if !strings.Contains(replies[1].Message, "max_payload") || !strings.Contains(replies[2].Message, "max_msg_size") {
		t.Errorf("messages do not say which limit: %q, %q", replies[1].Message, replies[2].Message)
	}
	if n := streamMsgs(t, s); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
}

func TestPublishWithoutStreamIsRetryable(t *testing.T) {
	url, name, _ := newStream(t, nil)
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name, SubjectPrefix: name + "_nobody"})
	r := publish(t, p, []outbox.Message{message("evt_x", "test.event", `{}`)})[0]
	if r.OK() || !r.Retryable || r.Code != postbox.CodeUnavailable || !strings.Contains(r.Message, name+"_nobody.test.event") {
		t.Errorf("reply %+v, want a retryable NACK naming the subject", r)
	}
}

// publishFails publishes msgs and fails the test unless Publish fails the
// whole batch, which it returns the error of.
func publishFails(t testing.TB, p *outboxnats.Publisher, msgs []outbox.Message) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	replies, err := p.Publish(ctx, msgs)
	if err == nil || replies != nil {
		t.Fatalf("Publish = %+v, %v; want an error for the batch", replies, err)
	}
	return err
}

// TestPublishStreamOutageFailsBatch puts a stream in states that refuse
// every message: Publish must fail the batch, not NACK each message, or
// the relay would count the outage against RelayConfig.MaxAttempts.
func TestPublishStreamOutageFailsBatch(t *testing.T) {
	t.Run("full", func(t *testing.T) {
		url, name, _ := newStream(t, func(c *jetstream.StreamConfig) { c.MaxMsgs = 1; c.Discard = jetstream.DiscardNew })
		_, js := connect(t, url)
		p := newPublisher(t, js, outboxnats.Config{Stream: name})
		publish(t, p, messages("first", 1))
		err := publishFails(t, p, messages("full", 3))
		if !strings.Contains(err.Error(), "maximum messages exceeded") {
			t.Errorf("error %v does not say why", err)
		}
	})
	t.Run("sealed", func(t *testing.T) {
		url, name, s := newStream(t, nil)
		_, js := connect(t, url)
		cfg := s.CachedInfo().Config
		cfg.Sealed = true
		if _, err := js.UpdateStream(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		p := newPublisher(t, js, outboxnats.Config{Stream: name})
		publishFails(t, p, messages("sealed", 3))
	})
	t.Run("deleted", func(t *testing.T) {
		url, name, _ := newStream(t, nil)
		_, js := connect(t, url)
		p := newPublisher(t, js, outboxnats.Config{Stream: name})
		if err := js.DeleteStream(context.Background(), name); err != nil {
			t.Fatal(err)
		}
		if err := publishFails(t, p, messages("deleted", 3)); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("error %v, want one wrapping jetstream.ErrStreamNotFound", err)
		}
	})
}

// TestPublishRecreatesDeletedStream: with CreateStream, the stream found
// missing by one Publish is created again by the next.
func TestPublishRecreatesDeletedStream(t *testing.T) {
	url := testenv.URL(t, testenv.NATS)
	_, js := connect(t, url)
	name := fmt.Sprintf("OUTBOXNATS_RECREATED_%d", time.Now().UnixNano())
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	p := newPublisher(t, js, outboxnats.Config{Stream: name, CreateStream: true})
	publish(t, p, messages("before", 1))
	if err := js.DeleteStream(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	publishFails(t, p, messages("gone", 1))
	if r := publish(t, p, messages("again", 1))[0]; !r.OK() || r.Duplicate {
		t.Fatalf("reply %+v, want a fresh ACK in the re-created stream", r)
	}
}

func TestPublishSubjectLimitIsPerMessage(t *testing.T) {
	url, name, s := newStream(t, func(c *jetstream.StreamConfig) {
		c.Discard, c.DiscardNewPerSubject, c.MaxMsgsPerSubject = jetstream.DiscardNew, true, 1
	})
	_, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	replies := publish(t, p, []outbox.Message{
		message("evt_a1", "a", `{}`), message("evt_a2", "a", `{}`), message("evt_b1", "b", `{}`),
	})
	if !replies[0].OK() || !replies[2].OK() {
		t.Errorf("first of each subject not ACKed: %+v, %+v", replies[0], replies[2])
	}
	if r := replies[1]; r.OK() || !r.Retryable || !strings.Contains(r.Message, "per subject") {
		t.Errorf("second of a full subject: reply %+v, want a retryable NACK saying why", r)
	}
	if n := streamMsgs(t, s); n != 2 {
		t.Errorf("stream holds %d messages, want 2", n)
	}
}

// failingJS is a JetStream context whose publishes are answered by fail's
// error instead of the server's PubAck: what the shared server cannot be
// made to say (a cluster electing a leader, a server out of resources).
// Everything else, stream lookups included, goes to the server.
type failingJS struct {
	jetstream.JetStream
	fail error
}

func (js failingJS) PublishMsgAsync(m *nats.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f := failedFuture{m, make(chan error, 1)}
	f.err <- js.fail
	return f, nil
}

type failedFuture struct {
	msg *nats.Msg
	err chan error
}

func (f failedFuture) Ok() <-chan *jetstream.PubAck { return nil }
func (f failedFuture) Err() <-chan error            { return f.err }
func (f failedFuture) Msg() *nats.Msg               { return f.msg }

// TestPublishRepliesByWhomTheyConcern: an answer that would refuse every
// message fails the batch; one about this message is its NACK.
func TestPublishRepliesByWhomTheyConcern(t *testing.T) {
	url, name, _ := newStream(t, nil)
	_, js := connect(t, url)
	apiErr := func(code, errCode int, desc string) error {
		return &jetstream.APIError{Code: code, ErrorCode: jetstream.ErrorCode(errCode), Description: desc}
	}
	outages := map[string]error{
		"insufficient resources":     apiErr(503, 10023, "insufficient resources"),
		"stream store failed":        apiErr(503, 10077, "write /data/jetstream/msgs/1.blk: no space left on device"),
		"stream full":                apiErr(503, 10077, "maximum bytes exceeded"),
		"cluster unavailable":        apiErr(503, 10008, "JetStream system temporarily unavailable"),
		"stream offline":             apiErr(500, 10118, "stream is offline"),
		"account limits":             apiErr(400, 10002, "resource limits exceeded for account"),
		"too many requests":          apiErr(429, 10167, "too many requests"),
		"unknown error code":         apiErr(400, 19999, "something new"),
		"no responders, no leader":   jetstream.ErrNoStreamResponse, // the stream listens on the subject
		"unreadable PubAck":          jetstream.ErrInvalidJSAck,
		"publish timeout":            jetstream.ErrAsyncPublishTimeout,
		"disconnected while waiting": nats.ErrDisconnected,
	}
	for what, fail := range outages {
		t.Run(what, func(t *testing.T) {
			p := newPublisher(t, failingJS{js, fail}, outboxnats.Config{Stream: name})
			if err := publishFails(t, p, messages("outage", 3)); !errors.Is(err, fail) {
				t.Errorf("error %v does not wrap %v", err, fail)
			}
		})
	}

	refusals := []struct {
		what      string
		fail      error
		code      postbox.Code
		retryable bool
	}{
		{"message over max_msg_size", apiErr(400, 10054, "message size exceeds maximum allowed"), postbox.CodeTooLarge, false},
		{"headers over 64k", apiErr(400, 10097, "header size exceeds maximum allowed of 64k"), postbox.CodeTooLarge, false},
		{"record too large for the store", apiErr(503, 10077, "message to large"), postbox.CodeTooLarge, false},
		{"subject full", apiErr(503, 10077, "maximum messages per subject exceeded"), postbox.CodeUnavailable, true},
		{"id in process", apiErr(409, 10158, "duplicate message id is in process"), postbox.CodeUnavailable, true},
		{"wrong last sequence", apiErr(400, 10071, "wrong last sequence: 7"), postbox.CodeUnavailable, true},
	}
	for _, tc := range refusals {
		t.Run(tc.what, func(t *testing.T) {
			p := newPublisher(t, failingJS{js, tc.fail}, outboxnats.Config{Stream: name})
			for _, r := range publish(t, p, messages("refused", 2)) {
				if r.OK() || r.Code != tc.code || r.Retryable != tc.retryable {
					t.Errorf("reply %+v, want a NACK %s, retryable %v", r, tc.code, tc.retryable)
				}
			}
		})
	}
	t.Run("subject no stream listens on", func(t *testing.T) {
		p := newPublisher(t, failingJS{js, jetstream.ErrNoStreamResponse}, outboxnats.Config{Stream: name, SubjectPrefix: name + "_nobody"})
		for _, r := range publish(t, p, messages("nobody", 2)) {
			if r.OK() || !r.Retryable || !strings.Contains(r.Message, name+"_nobody.test.event") {
				t.Errorf("reply %+v, want a retryable NACK naming the subject", r)
			}
		}
	})
}

// TestRelayDoesNotParkDuringOutage runs the relay, with MaxAttempts 1,
// into a full stream (DiscardNew): nothing may be parked, and once there
// is room again everything is delivered.
func TestRelayDoesNotParkDuringOutage(t *testing.T) {
	url, name, s := newStream(t, func(c *jetstream.StreamConfig) { c.MaxMsgs = 1; c.Discard = jetstream.DiscardNew })
	_, js := connect(t, url)
	pub := newPublisher(t, js, outboxnats.Config{Stream: name})
	publish(t, pub, messages("filler", 1))

	store, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); store.Close() })
	wg.Go(func() { store.Run(ctx) })

	const n = 20
	envs := make([]postbox.Envelope, n)
	for i := range envs {
		envs[i] = postbox.Envelope{
			SchemaVersion: postbox.SchemaVersion, EventID: fmt.Sprintf("evt_outage_%02d", i), Type: "sensor.reading",
			TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "dev-1", Payload: json.RawMessage(`{}`),
		}
	}
	if _, err := store.Insert(ctx, envs); err != nil {
		t.Fatal(err)
	}
	// The first publish that failed or parked rows, once settled.
	first := make(chan outbox.Stats, 1)
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{
		MaxAttempts: 1,
		Reconnect:   retry.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		Observe: func(st outbox.Stats) {
			if st.Err != nil || st.Rejected > 0 {
				select {
				case first <- st:
				default:
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { relay.Run(ctx) })

	select {
	case st := <-first:
		if st.Rejected > 0 || st.Err == nil {
			t.Fatalf("publish into the full stream parked %d rows, error %v; want none parked and the publish failed", st.Rejected, st.Err)
		}
		t.Logf("publish into the full stream failed: %v", st.Err)
	case <-time.After(20 * time.Second):
		t.Fatal("no publish into the full stream failed within 20s")
	}
	if _, rejected, err := store.Counts(ctx); err != nil || rejected > 0 {
		t.Fatalf("%d rows parked during the outage (%v)", rejected, err)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the outbox did not drain", func() bool {
		pending, rejected, err := store.Counts(ctx)
		if err != nil || rejected > 0 {
			t.Fatalf("%d rows parked (%v)", rejected, err)
		}
		return pending == 0
	})
	if got := streamMsgs(t, s); got != n {
		t.Fatalf("stream holds %d messages, want %d", got, n)
	}
}

func TestPublishCreatesStream(t *testing.T) {
	url := testenv.URL(t, testenv.NATS)
	_, js := connect(t, url)
	name := fmt.Sprintf("OUTBOXNATS_CREATED_%d", time.Now().UnixNano())
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	p := newPublisher(t, js, outboxnats.Config{Stream: name, CreateStream: true})
	if r := publish(t, p, []outbox.Message{message("evt_1", "a.b", `{}`)})[0]; !r.OK() {
		t.Fatalf("reply %+v", r)
	}
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != outboxnats.DefaultDuplicates || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != name+".>" || info.State.Msgs != 1 {
		t.Errorf("created stream: duplicates %s, subjects %v, %d messages", info.Config.Duplicates, info.Config.Subjects, info.State.Msgs)
	}
	// A second publisher finds the stream there and uses it.
	p2 := newPublisher(t, js, outboxnats.Config{Stream: name, CreateStream: true, Duplicates: time.Hour})
	if r := publish(t, p2, []outbox.Message{message("evt_1", "a.b", `{}`)})[0]; !r.OK() || !r.Duplicate {
		t.Fatalf("reply %+v, want a duplicate ACK", r)
	}
}

func TestPublishOnClosedConnectionFails(t *testing.T) {
	url, name, _ := newStream(t, nil)
	nc, js := connect(t, url)
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	nc.Close()
	replies, err := p.Publish(context.Background(), messages("closed", 3))
	if err == nil || replies != nil {
		t.Fatalf("Publish = %v, %v; want an error for the batch", replies, err)
	}
	if !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("error %v, want one wrapping nats.ErrConnectionClosed", err)
	}
}

// proxy forwards TCP connections to a NATS server. Hold stops what the
// server sends from reaching the client (PubAcks included); Kill breaks
// every connection, as a dying server or network would.
type proxy struct {
	ln     net.Listener
	target string
	hold   sync.RWMutex // write-locked while replies are held back
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
	held  bool
}

func newProxy(t testing.TB, natsURL string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: strings.TrimPrefix(natsURL, "nats://")}
	p.wg.Go(p.accept)
	t.Cleanup(func() { p.Kill(); p.wg.Wait() })
	return p
}

func (p *proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(s, c); s.Close() })
		p.wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					p.hold.RLock()
					_, werr := c.Write(buf[:n])
					p.hold.RUnlock()
					if werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			c.Close()
		})
	}
}

// Hold holds back what the server sends until Kill.
func (p *proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held {
		p.hold.Lock()
		p.held = true
	}
}

// Kill closes the listener and every connection, and ends a Hold.
func (p *proxy) Kill() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	if p.held {
		p.held = false
		p.hold.Unlock()
	}
}

// TestPublishOnDeadConnectionFails sends a batch whose PubAcks never come
// back, then breaks the connection: Publish fails the batch at once
// (not after AckTimeout), whether the client then reconnects or gives up.
func TestPublishOnDeadConnectionFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"reconnecting", []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(time.Hour)}},
		{"closed", []nats.Option{nats.NoReconnect()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, name, s := newStream(t, nil)
			px := newProxy(t, url)
			_, js := connect(t, px.URL(), tc.opts...)
			p := newPublisher(t, js, outboxnats.Config{Stream: name, AckTimeout: time.Minute})

			px.Hold()
			msgs := messages("dead", 50)
			type result struct {
				replies []postbox.Reply
				err     error
			}
			done := make(chan result, 1)
			go func() {
				r, err := p.Publish(context.Background(), msgs)
				done <- result{r, err}
			}()
			// The server stored them; their PubAcks are held in the proxy.
			eventually(t, 10*time.Second, "the server did not store the batch", func() bool { return streamMsgs(t, s) == uint64(len(msgs)) })
			select {
			case r := <-done:
				t.Fatalf("Publish returned with its PubAcks held back: %v, %v", r.replies, r.err)
			default:
			}
			start := time.Now()
			px.Kill()
			select {
			case r := <-done:
				if r.err == nil || r.replies != nil {
					t.Fatalf("Publish = %v, %v; want an error for the batch", r.replies, r.err)
				}
				t.Logf("failed %s after the connection broke: %v", time.Since(start).Round(time.Millisecond), r.err)
			case <-time.After(10 * time.Second):
				t.Fatal("Publish still waiting 10s after the connection broke")
			}
		})
	}
}

func TestPublishWaitIsBoundedByContext(t *testing.T) {
	url, name, _ := newStream(t, nil)
	px := newProxy(t, url)
	_, js := connect(t, px.URL())
	p := newPublisher(t, js, outboxnats.Config{Stream: name})
	px.Hold()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	replies, err := p.Publish(ctx, messages("bounded", 5))
	if err == nil || replies != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Publish = %v, %v; want a deadline error", replies, err)
	}
	// The same bound from AckTimeout.
	p = newPublisher(t, js, outboxnats.Config{Stream: name, AckTimeout: 200 * time.Millisecond})
	if replies, err := p.Publish(context.Background(), messages("bounded2", 5)); err == nil || replies != nil {
		t.Fatalf("Publish = %v, %v; want an error after AckTimeout", replies, err)
	}
}

func TestRelayFromSQLiteOutbox(t *testing.T) {
	url, name, s := newStream(t, nil)
	_, js := connect(t, url)
	pub := newPublisher(t, js, outboxnats.Config{Stream: name})

	store, err := outboxsqlite.Open(filepath.Join(t.TempDir(), "outbox.db"), outboxsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); store.Close() })
	wg.Go(func() { store.Run(ctx) })

	const n = 2000
	envs := make([]postbox.Envelope, n)
	for i := range envs {
		id := fmt.Sprintf("evt_relay_%05d", i)
		envs[i] = postbox.Envelope{
			SchemaVersion: postbox.SchemaVersion, EventID: id, Type: "sensor.reading",
			TS: "2030-01-02T03:04:05Z", SessionID: "sess-1", DeviceID: "dev-1",
			Payload: json.RawMessage(`{"i":` + fmt.Sprint(i) + `}`),
		}
	}
	for i := 0; i < n; i += 500 {
		if _, err := store.Insert(ctx, envs[i:i+500]); err != nil {
			t.Fatal(err)
		}
	}
	relay, err := outbox.NewRelay(store, pub, outbox.RelayConfig{BatchSize: 128})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { relay.Run(ctx) })

	eventually(t, 30*time.Second, "the outbox did not drain", func() bool {
		pending, rejected, err := store.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if rejected > 0 {
			t.Fatalf("%d rows rejected", rejected)
		}
		return pending == 0
	})
	if got := streamMsgs(t, s); got != n {
		t.Fatalf("stream holds %d messages, want %d", got, n)
	}
	payloads := map[string]string{}
	for _, e := range envs {
		payloads[e.EventID] = string(e.Payload)
	}
	seen := map[string]int{}
	for seq := uint64(1); seq <= n; seq++ {
		m := getMsg(t, s, seq)
		id := m.Header.Get(jetstream.MsgIDHeader)
		seen[id]++
		// An edge outbox hands out the payload, the envelope's fields as headers.
		if string(m.Data) != payloads[id] || m.Header.Get(outboxnats.HeaderCorrelationID) != "sess-1" || m.Header.Get(outboxnats.HeaderTenantID) != "dev-1" {
			t.Fatalf("sequence %d: body %s headers %v; want the payload of %s and its session and device", seq, m.Data, m.Header, id)
		}
		if m.Subject != name+".sensor.reading" {
			t.Fatalf("sequence %d: subject %s", seq, m.Subject)
		}
	}
	for _, e := range envs {
		if seen[e.EventID] != 1 {
			t.Errorf("%s stored %d times", e.EventID, seen[e.EventID])
		}
	}
}
