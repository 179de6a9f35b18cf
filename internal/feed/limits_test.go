package feed_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/testenv"
)

// recorder is a feed.Checkpoints that keeps the failures recorded.
type recorder struct {
	feed.Checkpoints
	mu       sync.Mutex
	failures []string
}

func (r *recorder) Failed(_ context.Context, _ string, _ int64, err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, err.Error())
	return nil
}

func (r *recorder) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.failures, "\n")
}

// TestFollowerLimits: feed events over the limits a WebSocket envelope or
// a webhook is refused for (a payload or metadata nested 5,000 deep, a
// 5,000-byte native id, a 10,000-byte type) are refused one by one,
// counted and recorded as the follower's failure; the valid events
// around them are stored and the checkpoint moves past them all.
func TestFollowerLimits(t *testing.T) {
	deep := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	lines := []string{
		`{"offset":1,"native_id":"ok1","type":"t","payload":{"a":1}}`,
		`{"offset":2,"native_id":"deep","type":"t","payload":{"a":` + deep + `}}`,
		`{"offset":3,"native_id":"` + strings.Repeat("n", 5000) + `","type":"t","payload":{"a":1}}`,
		`{"offset":4,"native_id":"longtype","type":"` + strings.Repeat("t", 10000) + `","payload":{"a":1}}`,
		`{"offset":5,"native_id":"deepmeta","type":"t","metadata":{"m":` + deep + `},"payload":{"a":1}}`,
		`{"offset":6,"native_id":"ok2","type":"t","payload":{"a":2}}`,
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", feed.ContentType)
		if r.URL.Query().Get("after") == "0" {
			fmt.Fprintln(w, strings.Join(lines, "\n"))
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	m := feed.NewMetrics(nil)
	rec := &recorder{Checkpoints: l.cps}
	f, _ := l.run(t, ts.URL+"/v1/streams/devices", m, rec, nil)
	waitCheckpoint(t, f, 6)
	got, err := l.b.ReadFrom(context.Background(), "mirror", 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range got {
		ids = append(ids, fmt.Sprintf("%.20s", e.NativeID))
	}
	if strings.Join(ids, ",") != "ok1,ok2" {
		t.Fatalf("stored %v, want ok1 and ok2", ids)
	}
	if n := m.Events("mirror", "refused"); n != 4 {
		t.Errorf(`events{result="refused"} = %v, want 4`, n)
	}
	testenv.Eventually(t, 5*time.Second, "the refusals recorded", func() bool { return rec.all() != "" })
	if want := `offset 2 (native id "deep") refused: payload: arrays and objects nested 5001 deep, at most 1000`; !strings.Contains(rec.all(), want) {
		t.Errorf("failures recorded %q: want %q", rec.all(), want)
	}
}
