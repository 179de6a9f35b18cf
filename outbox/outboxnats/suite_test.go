package outboxnats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-events/postbox/internal/natstest"
	"github.com/postbox-events/postbox/outbox/outboxnats"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the publisher suite on an in-process JetStream server.
// The event id is the Nats-Msg-Id, so a batch sent again within the
// duplicate window is stored once.
func TestSuite(t *testing.T) {
	outboxtest.RunPublisher(t, outboxtest.PublisherFeatures{Dedups: true}, func(t *testing.T) outboxtest.Target {
		_, js := connect(t, natstest.Start(t))
		p := newPublisher(t, js, outboxnats.Config{Stream: "ORDERS", CreateStream: true})
		return outboxtest.Target{Publisher: p, ReadBack: func(t *testing.T) []outboxtest.Received {
			ctx := context.Background()
			s, err := js.Stream(ctx, "ORDERS")
			if err == jetstream.ErrStreamNotFound {
				return nil // nothing published yet
			}
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var out []outboxtest.Received
			for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
				m, err := s.GetMsg(ctx, seq)
				if err != nil {
					t.Fatalf("message %d: %v", seq, err)
				}
				out = append(out, outboxtest.Received{EventID: m.Header.Get(jetstream.MsgIDHeader),
					Type: m.Header.Get(outboxnats.HeaderEventType), Payload: m.Data})
			}
			return out
		}}
	})
}
