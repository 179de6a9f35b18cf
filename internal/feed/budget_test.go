package feed_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/budget"
	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestFollowerBudget: two followers of feeds of 100 KiB lines share a
// budget of 512 KiB: both store every event, the budget is never
// exceeded and is all given back once they stop; a line over the
// budget's reserve (256 KiB) fails the connection naming the limit
// instead of being read whole.
func TestFollowerBudget(t *testing.T) {
	pad := strings.Repeat("p", 100<<10)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", feed.ContentType)
		if r.URL.Query().Get("after") == "0" {
			for i := 1; i <= 30; i++ {
				fmt.Fprintf(w, `{"offset":%d,"native_id":"e%d","type":"t","payload":{"pad":"%s"}}`+"\n", i, i, pad)
			}
			if strings.HasPrefix(r.URL.Path, "/huge/") {
				fmt.Fprintf(w, `{"offset":31,"native_id":"e31","type":"t","payload":{"pad":"%s"}}`+"\n", strings.Repeat(pad, 3))
			}
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	var peak atomic.Int64
	var b *budget.Budget
	b = budget.New(512<<10, 256<<10, func(int64) {
		for u := b.Used(); u > peak.Load(); {
			if peak.CompareAndSwap(peak.Load(), u) {
				break
			}
		}
	})
	m := feed.NewMetrics(nil)
	var stops []func()
	var fs []*feed.Follower
	for _, path := range []string{"/a/v1/streams/devices", "/b/v1/streams/devices"} {
		l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
		f, stop := l.run(t, ts.URL+path, m, nil, func(c *feed.Config) { c.Budget = b; c.BatchSize = 500 })
		fs, stops = append(fs, f), append(stops, stop)
	}
	for _, f := range fs {
		waitCheckpoint(t, f, 30)
	}
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	var failures recorder
	failures.Checkpoints = l.cps
	_, stop := l.run(t, ts.URL+"/huge/v1/streams/devices", m, &failures, func(c *feed.Config) { c.Budget = b })
	stops = append(stops, stop)
	testenv.Eventually(t, 10*time.Second, "the huge line refused", func() bool {
		return strings.Contains(failures.all(), fmt.Sprintf("a line longer than %d bytes", 256<<10))
	})
	for _, stop := range stops {
		stop()
	}
	if u := b.Used(); u != 0 {
		t.Errorf("%d bytes of the budget still taken after the followers stopped", u)
	}
	if p := peak.Load(); p > b.Size() {
		t.Errorf("%d bytes taken at most, over the budget of %d", p, b.Size())
	}
}
