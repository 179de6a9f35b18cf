package intake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/intake"
	"github.com/postbox-events/postbox/internal/testenv"
)

// pagedAPI serves items 1..n by ?after= in pages of per, with next
// until the last page, and counts the requests.
func pagedAPI(t *testing.T, n, per int, requests *atomic.Int64) *httptest.Server {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		var items []string
		for i := after + 1; i <= min(after+per, n); i++ {
			items = append(items, fmt.Sprintf(`{"id":"e%d","kind":"push"}`, i))
		}
		next := "null"
		if after+per < n {
			next = strconv.Quote(strconv.Itoa(after + per))
		}
		fmt.Fprintf(w, `{"items":[%s],"next":%s}`, strings.Join(items, ","), next)
	}))
	t.Cleanup(api.Close)
	return api
}

// TestRunner: the runner polls a poll source only while this process
// leads, stores every item once with its checkpoint (in the events'
// transaction where the writer commits to the store's database, after
// them elsewhere), and stops the source's poller once it is deleted.
func TestRunner(t *testing.T) {
	eachStore(t, func(t *testing.T, kind storeKind) {
		var requests atomic.Int64
		api := pagedAPI(t, 25, 10, &requests)
		e := open(t, kind, openOptions{})
		ctx := context.Background()
		settings := `{"url": "` + api.URL + `/events", "items": "/items", "id": "/id", "type": "/kind", "cursor_param": "after", "next": "/next", "interval": "20ms"}`
		if _, _, err := e.st.CreateSource(ctx, intake.Source{Name: "gh", Kind: intake.KindPoll, Settings: json.RawMessage(settings)}); err != nil {
			t.Fatal(err)
		}
		var leads atomic.Bool
		// began says a round of the runner began: each asks Leads first.
		// With an hour between rescans, only Poke begins one after the first.
		began := make(chan struct{}, 64)
		cfg := intake.RunnerConfig{Store: e.st, Writer: e.streams, RescanInterval: time.Hour,
			Leads: func() bool {
				select {
				case began <- struct{}{}:
				default:
				}
				return leads.Load()
			}}
		if kind == sqliteStore {
			cfg.AppendWith = e.streams // the store is the streams' database
		}
		r, err := intake.NewRunner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(runCtx) }()
		defer func() { stop(); <-done }()
		// round returns once a round of the runner that began after the
		// call has ended: what it started or stopped then is so.
		round := func() {
			t.Helper()
			for len(began) > 0 {
				<-began
			}
			for range 2 {
				r.Poke()
				select {
				case <-began:
				case <-time.After(30 * time.Second):
					t.Fatal("the runner began no round")
				}
			}
		}

		round()
		if n := requests.Load(); n != 0 {
			t.Fatalf("%d requests while this process does not lead", n)
		}
		leads.Store(true)
		round()
		testenv.Eventually(t, 20*time.Second, "25 items and the checkpoint at the last page", func() bool {
			src, err := e.st.Source(ctx, "gh")
			st, _ := e.streams.Stats(ctx, "gh")
			return err == nil && src.Checkpoint.Cursor == "20" && st.LastOffset == 25
		})
		if err := e.st.DeleteSource(ctx, "gh"); err != nil {
			t.Fatal(err)
		}
		round()
		n := requests.Load()
		round()
		if got := requests.Load(); got != n {
			t.Fatalf("the deleted source's poller made %d requests after it was stopped", got-n)
		}
		if c := e.count(t, `SELECT count(*) FROM source_checkpoints WHERE source_id = ?`, "gh"); c != 0 {
			t.Fatalf("the deleted source's checkpoint came back (%d rows)", c)
		}
	})
}

// TestNewRunner: a runner needs a store and a writer.
func TestNewRunner(t *testing.T) {
	if _, err := intake.NewRunner(intake.RunnerConfig{}); err == nil || !strings.Contains(err.Error(), "RunnerConfig.Store") {
		t.Fatalf("NewRunner without a store: %v", err)
	}
}
