package client_test

import (
	"context"
	"encoding/json"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/outbox"
	"github.com/postbox-events/postbox/outbox/outboxtest"
)

// TestSuite runs the publisher suite on a Publisher to an in-process
// server: the Publisher puts each message into its envelope. The server
// stores an event id once.
func TestSuite(t *testing.T) { runSuite(t, false) }

// TestSuiteGRPC runs the publisher suite on a Publisher to the server's
// gRPC ingress.
func TestSuiteGRPC(t *testing.T) { runSuite(t, true) }

func runSuite(t *testing.T, overGRPC bool) {
	outboxtest.RunPublisher(t, outboxtest.PublisherFeatures{Dedups: true}, func(t *testing.T) outboxtest.Target {
		var cfg server.Config
		if overGRPC {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			cfg.GRPCListener = ln
		}
		s := servertest.Start(t, cfg, nil)
		url := s.WS
		if overGRPC {
			url = "grpc://" + cfg.GRPCListener.Addr().String()
		}
		p, err := client.NewPublisher(url, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		used := &usedPublisher{Publisher: p}
		t.Cleanup(func() {
			// The server's shutdown must not overlap a connection that is
			// still starting: the ingress counts sessions in a
			// sync.WaitGroup whose Add, for a connection accepted as Drain
			// begins, races with Drain's Wait (the race detector reports
			// it). So once the publisher connected, the connection is
			// seen open and then closed before the server stops.
			if used.n.Load() > 0 {
				testenv.Eventually(t, 10*time.Second, "the connection to be open", func() bool { return connections(t, s) > 0 })
			}
			p.Close()
			testenv.Eventually(t, 10*time.Second, "the connection to close", func() bool { return connections(t, s) == 0 })
		})
		return outboxtest.Target{Publisher: used, ReadBack: func(t *testing.T) []outboxtest.Received {
			rows, err := s.Store().ReadDB().Query(`SELECT source_native_id, event_type, raw_payload_json FROM stream_events`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []outboxtest.Received
			for rows.Next() {
				var r outboxtest.Received
				var payload string
				if err := rows.Scan(&r.EventID, &r.Type, &payload); err != nil {
					t.Fatal(err)
				}
				r.Payload = json.RawMessage(payload)
				out = append(out, r)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return out
		}}
	})
}

// usedPublisher counts Publish calls.
type usedPublisher struct {
	*client.Publisher
	n atomic.Int64
}

func (u *usedPublisher) Publish(ctx context.Context, msgs []outbox.Message) ([]postbox.Reply, error) {
	u.n.Add(1)
	return u.Publisher.Publish(ctx, msgs)
}
