package server_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestWebhookItemWithItsEvent: on the SQLite default, once the default
// subscription's loop has caught up, a webhook's item is written in the
// transaction that stores the webhook: it is there when 202 answers.
func TestWebhookItemWithItsEvent(t *testing.T) {
	ts := start(t, server.Config{}, nil)
	n := 0
	testenv.Eventually(t, 20*time.Second, "a webhook's item written with it", func() bool {
		n++
		status, body, _ := post(t, ts, `{"n": `+strconv.Itoa(n)+`}`, map[string]string{"Idempotency-Key": fmt.Sprintf("inline-%d", n)})
		if status != http.StatusAccepted {
			t.Fatalf("POST /webhooks: %d %v", status, body)
		}
		offset, err := strconv.Atoi(strings.TrimPrefix(fmt.Sprint(body["id"]), "wh_"))
		if err != nil {
			t.Fatalf("id %v", body["id"])
		}
		items := ts.queryInt(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'webhooks' AND "offset" = ?`, offset)
		return items == 1
	})
	// Each webhook has one item, whichever wrote it.
	testenv.Eventually(t, 20*time.Second, "every webhook's item", func() bool {
		return ts.queryInt(t, `SELECT count(*) FROM inbox_items WHERE subscription_id = 'webhooks'`) == n
	})
	if got := ts.queryInt(t, `SELECT count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = 'webhooks'`); got != n {
		t.Fatalf("items of %d distinct webhooks, want %d", got, n)
	}
}
