package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-events/postbox/internal/testenv"
)

// TestExample runs the example against the real PostgreSQL (a schema of
// its own) and Redis, as CI does.
func TestExample(t *testing.T) {
	db := testenv.PostgresSchema(t)
	rdb := testenv.URL(t, testenv.Redis)
	var out bytes.Buffer
	cfg := config{DB: db, Redis: rdb, Stream: fmt.Sprintf("example-orders-%d", time.Now().UnixNano()), Orders: 50, Resend: 10, Out: &out}
	t.Cleanup(func() {
		opts, _ := redis.ParseURL(rdb)
		c := redis.NewClient(opts)
		c.Del(context.Background(), cfg.Stream)
		c.Close()
	})
	sum, err := run(context.Background(), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	want := summary{Placed: 50, RolledBack: 1, Relayed: 50, StreamEntries: 60, Shipments: 50, SkippedDuplicates: 10}
	if sum != want {
		t.Fatalf("summary %+v, want %+v", sum, want)
	}
	if !strings.Contains(out.String(), "shipments created:        50 (duplicates skipped by dedup: 10)") {
		t.Fatalf("output:\n%s", out.String())
	}
}
