package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/server"
	"github.com/postbox-events/postbox/stream/streampg"
)

// TestEmbeddedCluster: two embedded servers share a PostgreSQL store and
// PostgreSQL streams; webhooks posted to either, some to both, are each
// stored once and handled by the Go handlers of the two.
func TestEmbeddedCluster(t *testing.T) {
	u := testenv.PostgresSchema(t)
	pu, _ := url.Parse(u)
	schema := pu.Query().Get("search_path")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	handled := map[string]int{}
	var bases []string
	var runs sync.WaitGroup
	for i := range 2 {
		streams, err := streampg.Open(ctx, streampg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		store, err := server.OpenPostgresStore(ctx, u, schema)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv, err := server.New(server.Config{DBPath: filepath.Join(t.TempDir(), "unused.db"), Listener: ln, Streams: streams, Store: store,
			Delivery: server.DeliveryConfig{Node: fmt.Sprint("n", i)},
			Handlers: map[string]server.Handler{server.WebhookSource: func(_ context.Context, it *server.Item) error {
				mu.Lock()
				handled[it.EventID]++
				mu.Unlock()
				return nil
			}}})
		if err != nil {
			t.Fatal(err)
		}
		runs.Go(func() { srv.Run(ctx) })
		bases = append(bases, "http://"+ln.Addr().String())
	}
	for _, b := range bases {
		testenv.Eventually(t, 30*time.Second, b+" ready", func() bool {
			resp, err := http.Get(b + "/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	post := func(base, key string) {
		req, _ := http.NewRequest("POST", base+"/webhooks", bytes.NewBufferString(`{"id":"`+key+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s to %s: %s", key, base, resp.Status)
		}
	}
	for i := range 20 {
		key := fmt.Sprint("k", i)
		post(bases[i%2], key)
		if i%4 == 0 {
			post(bases[(i+1)%2], key) // the same webhook through the other server
		}
	}
	testenv.Eventually(t, 30*time.Second, "every webhook handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 20
	})
	stop()
	runs.Wait()
	for id, n := range handled {
		if n != 1 {
			t.Errorf("webhook %s handled %d times, want once", id, n)
		}
	}
}
