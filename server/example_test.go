package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/postbox-events/postbox/retry"
	"github.com/postbox-events/postbox/server"
)

// A program embeds the control plane and completes every webhook with a Go
// function: an order is handled once it has an id; one without is a dead
// letter at once, since no retry can fix it.
func Example() {
	dir, _ := os.MkdirTemp("", "postbox-example-*")
	defer os.RemoveAll(dir)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	handled := make(chan string, 2)
	srv, err := server.New(server.Config{
		DBPath:   filepath.Join(dir, "postbox.db"),
		Listener: ln,
		Delivery: server.DeliveryConfig{MaxAttempts: 3},
		Handlers: map[string]server.Handler{
			server.WebhookSource: func(ctx context.Context, it *server.Item) error {
				var order struct{ ID string }
				if err := json.Unmarshal(it.Payload, &order); err != nil || order.ID == "" {
					handled <- "dead letter: " + it.EventID
					return retry.Permanent(errors.New("an order without an id"))
				}
				handled <- "handled order " + order.ID + " (" + it.Type + ")"
				return nil
			},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- srv.Run(ctx) }()
	base := "http://" + ln.Addr().String()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(base + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
	}
	post := func(key, body string) {
		req, _ := http.NewRequest("POST", base+"/webhooks", bytes.NewBufferString(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Event-Type", "order.paid")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			fmt.Println("POST /webhooks:", resp.Status)
		}
	}
	post("delivery-1", `{"id": "o-17"}`)
	fmt.Println(<-handled)
	post("delivery-2", `{"note": "no id"}`)
	fmt.Println(<-handled)
	stop()
	<-done
	// Output:
	// POST /webhooks: 202 Accepted
	// handled order o-17 (order.paid)
	// POST /webhooks: 202 Accepted
	// dead letter: delivery-2
}
