package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
)

// A message whose envelope cannot be encoded is refused for good in its
// place, and the others of the batch are sent.
func TestPublisherRefusesABodyThatIsNotJSON(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	p, err := client.NewPublisher(s.WS, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Close()
		testenv.Eventually(t, 10*time.Second, "the connection to close", func() bool { return connections(t, s) == 0 })
	}()
	created := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	msgs := []outbox.Message{
		{EventID: "evt-ok-1", Type: "t", Body: []byte(`{"n":1}`), TenantID: "dev-1", CreatedAt: created},
		{EventID: "evt-broken", Type: "t", Body: []byte(`{"n":`), TenantID: "dev-1", CreatedAt: created},
		{EventID: "evt-ok-2", Type: "t", Body: []byte(`{"n":2}`), TenantID: "dev-1", CreatedAt: created},
		// Nested past what a frame can hold: the frame would be refused
		// whole, every event in it unanswered.
		{EventID: "evt-deep", Type: "t", Body: []byte(strings.Repeat("[", 9999) + strings.Repeat("]", 9999)), TenantID: "dev-1", CreatedAt: created},
	}
	replies, err := p.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(replies) != 4 {
		t.Fatalf("%d replies to 4 messages: %+v", len(replies), replies)
	}
	if r := replies[3]; r.OK() || r.EventID != "evt-deep" || r.Code != postbox.CodeInvalidField || r.Field != "payload" || r.Retryable {
		t.Fatalf("reply to the deep body: %+v; want a non-retryable invalid_field NACK naming the payload", r)
	}
	if len(replies) != 4 || !replies[0].OK() || !replies[2].OK() || replies[0].EventID != "evt-ok-1" || replies[2].EventID != "evt-ok-2" {
		t.Fatalf("replies %+v: want the first and last ACKed", replies)
	}
	if r := replies[1]; r.OK() || r.EventID != "evt-broken" || r.Code != postbox.CodeInvalidJSON || r.Field != "payload" || r.Retryable {
		t.Fatalf("reply to the broken body: %+v; want a non-retryable invalid_json NACK naming the payload", r)
	}
	var n int
	if err := s.Store().ReadDB().QueryRow(`SELECT count(*) FROM stream_events`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("the server holds %d events, want 2", n)
	}
}

// Options.AckTimeout bounds the wait for a batch's replies: past it the
// Publisher gives the connection up, well before DefaultAckTimeout.
func TestPublisherAckTimeoutFromOptions(t *testing.T) {
	s := servertest.Start(t, server.Config{}, nil)
	hole := newBlackhole(t, s.Addr)
	p, err := client.NewPublisher("ws://"+hole.ln.Addr().String(), client.Options{AckTimeout: 200 * time.Millisecond, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg := func(id string) []outbox.Message {
		return []outbox.Message{{EventID: id, Type: "t", Body: []byte(`{}`), TenantID: "dev-1", CreatedAt: time.Now()}}
	}
	if _, err := p.Publish(ctx, msg("evt-before-the-hole")); err != nil {
		t.Fatalf("publish before the network died: %v", err)
	}
	hole.dead.Store(true)
	_, err = p.Publish(ctx, msg("evt-into-the-hole"))
	if err == nil || !strings.Contains(err.Error(), "no replies within 200ms") {
		t.Fatalf("publish into a dead network: %v; want no replies within 200ms", err)
	}
}
