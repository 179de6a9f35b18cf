package deliverypg_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/stdwebhook"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestEndpointChangeReachesEveryNode: a secret rotated on one process
// signs the requests of another, which had the old endpoint in hand,
// within a bounded time.
func TestEndpointChangeReachesEveryNode(t *testing.T) {
	const secretA, secretB = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ=="
	keyB, _ := stdwebhook.ParseSecret(secretB)
	type request struct {
		h    http.Header
		body []byte
	}
	var mu sync.Mutex
	var got []request
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, request{r.Header.Clone(), body})
		mu.Unlock()
	}))
	defer tg.Close()
	requests := func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), got...)
	}
	c := newCluster(t)
	a, b := c.start("a", delivery.Config{}), c.start("b", delivery.Config{})
	create(t, a, delivery.Subscription{Name: "s", Source: "devices", Target: tg.URL, Secrets: []delivery.Secret{{Key: secretA}}})
	c.appendEvents("before", 4)
	testenv.Eventually(t, 20*time.Second, "the first deliveries", func() bool { return len(requests()) == 4 })

	b2 := secretB
	if _, err := b.d.Update(context.Background(), "s", delivery.Change{Secret: &b2}); err != nil {
		t.Fatal(err)
	}
	b.stop() // a alone delivers from here on, with what it read before
	start := time.Now()
	for i := 0; ; i++ {
		n := len(requests())
		c.appendEvents(fmt.Sprint("after", i), 1)
		testenv.Eventually(t, 20*time.Second, "a delivery", func() bool { return len(requests()) > n })
		r := requests()[n]
		if stdwebhook.Verify([][]byte{keyB}, r.h.Get("webhook-id"), r.h.Get("webhook-timestamp"), r.h.Get("webhook-signature"), r.body, c.clock.Now()) == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10s after the rotation on b, a still signs without the new secret: %v", r.h)
		}
	}
}
