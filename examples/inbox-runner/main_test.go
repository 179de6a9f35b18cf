package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"
)

// TestExample runs the example with a server of its own: every order is
// shipped once, the slow one past its visibility timeout, and the webhook
// that is not an order is refused.
func TestExample(t *testing.T) {
	var out bytes.Buffer
	cfg := config{Inbox: "webhooks", N: 60, Concurrency: 8, Work: time.Millisecond, Visibility: time.Second, Out: &out,
		Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := run(ctx, cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the example did not finish within 2 minutes")
	}
	if want := (summary{Shipped: 59, Refused: 1, Slow: 1}); sum != want {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
}
