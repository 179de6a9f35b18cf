package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
)

// BenchmarkWebhookHandler measures POST /webhooks through the server's
// handler without a network: each op is one new webhook (~300 bytes, the
// headers of postbox bench webhooks) answered 202 once stored, its item of
// the default subscription written with it. 64 goroutines post at once so
// that group commits batch as they do under bench webhooks;
// synchronous=NORMAL keeps the fsync of each commit out of the numbers. -benchmem's
// allocs/op count the handler's and the writer's allocations per webhook.
//
//	go test -run '^$' -bench WebhookHandler -benchmem -count 5 ./internal/server/
func BenchmarkWebhookHandler(b *testing.B) {
	ts := servertest.Start(b, server.Config{Synchronous: "NORMAL"}, nil)
	h := ts.Srv.Handler()
	payload := []byte(`{"object":"event","type":"invoice.paid","created":1763683200,"livemode":false,` +
		`"data":{"object":{"id":"in_1QbenchA2b3C4d5E","object":"invoice","amount_paid":4200,"currency":"eur",` +
		`"customer":"cus_bench0001","status":"paid","description":"` + string(bytes.Repeat([]byte("x"), 80)) + `"}}}`)
	var next atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := &reusableBody{}
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "/webhooks", body)
		if err != nil {
			b.Error(err)
			return
		}
		req.RemoteAddr = "127.0.0.1:50000"
		req.Header = http.Header{
			"Content-Type":    {"application/json"},
			"Idempotency-Key": {""},
			"X-Event-Type":    {"invoice.paid"},
			"User-Agent":      {"postbox-bench"},
		}
		w := &discardWriter{h: http.Header{}}
		key := make([]byte, 0, 32)
		for pb.Next() {
			key = strconv.AppendInt(append(key[:0], "bench-"...), next.Add(1), 10)
			req.Header["Idempotency-Key"][0] = string(key)
			body.Reset(payload)
			req.ContentLength = int64(len(payload))
			clear(w.h)
			w.status = 0
			h.ServeHTTP(w, req)
			if w.status != http.StatusAccepted {
				b.Errorf("status %d", w.status)
				return
			}
		}
	})
}

// reusableBody is a request body read again for each request.
type reusableBody struct{ bytes.Reader }

func (*reusableBody) Close() error { return nil }

// discardWriter is a ResponseWriter that keeps the status alone.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }

func (w *discardWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

var _ io.ReadCloser = (*reusableBody)(nil)
