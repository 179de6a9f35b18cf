package feed_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream"
	"github.com/postbox-events/postbox/stream/streamsqlite"
)

// local is the follower's side: a SQLite stream backend (its own writer)
// with the stream "mirror" and the checkpoints table.
type local struct {
	b   *streamsqlite.Backend
	cps *feed.StoreCheckpoints
}

func openLocal(t *testing.T, path string) *local {
	t.Helper()
	b, err := streamsqlite.Open(path, streamsqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("writer: %v", err)
		}
		b.Close()
	})
	if _, err := b.EnsureStream(ctx, "mirror"); err != nil {
		t.Fatal(err)
	}
	cps, err := feed.NewStoreCheckpoints(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	return &local{b: b, cps: cps}
}

// run runs a follower of feedURL into l until the returned stop is called.
func (l *local) run(t *testing.T, feedURL string, m *feed.Metrics, cps feed.Checkpoints, tweak func(*feed.Config)) (*feed.Follower, func()) {
	t.Helper()
	if cps == nil {
		cps = l.cps
	}
	cfg := feed.Config{URL: feedURL, Stream: "mirror", Writer: l.b, Checkpoints: cps, Metrics: m,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, BatchSize: 7}
	if tweak != nil {
		tweak(&cfg)
	}
	f, err := feed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return f, stop
}

// appendUp stores n events in the upstream server's devices stream,
// numbered from first.
func appendUp(t *testing.T, up *servertest.Server, first, n int) {
	t.Helper()
	evs := make([]stream.Event, n)
	for i := range evs {
		k := first + i
		evs[i] = stream.Event{NativeID: fmt.Sprintf("evt_%04d", k), Variant: fmt.Sprintf("pi-%d", k%3), Type: "t",
			Metadata: json.RawMessage(`{"k":` + fmt.Sprint(k) + `}`), Payload: json.RawMessage(fmt.Sprintf("{\n \"n\": %d\n}", k))}
	}
	if _, err := up.Srv.Streams().Append(context.Background(), server.DeviceSource, evs); err != nil {
		t.Fatal(err)
	}
}

// wantMirror checks that the mirror holds the upstream's devices events,
// each once, in the upstream's order, byte for byte.
func wantMirror(t *testing.T, up *servertest.Server, l *local) {
	t.Helper()
	ctx := context.Background()
	st, err := up.Srv.Streams().Stats(ctx, server.DeviceSource)
	if err != nil {
		t.Fatal(err)
	}
	upEvs, err := stream.ReadFrom(ctx, up.Srv.Streams(), server.DeviceSource, 1, int(st.LastOffset)+10)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.b.ReadFrom(ctx, "mirror", 1, len(upEvs)+10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(upEvs) {
		t.Fatalf("the mirror holds %d events, upstream %d", len(got), len(upEvs))
	}
	for i, u := range upEvs {
		g := got[i]
		if g.NativeID != u.NativeID || g.Variant != u.Variant || g.Type != u.Type || string(g.Payload) != string(u.Payload) ||
			string(g.Metadata) != string(u.Metadata) || !g.OccurredAt.Equal(u.OccurredAt) {
			t.Fatalf("mirror event %d is %+v, upstream %+v", i+1, g.Event, u.Event)
		}
	}
}

func waitCheckpoint(t *testing.T, f *feed.Follower, want int64) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, fmt.Sprintf("the checkpoint to reach %d", want), func() bool { return f.Checkpoint() == want })
}

// TestFollowerResumes: a follower stores the feed, follows new events,
// and a new follower on the same database resumes after the checkpoint,
// asking for nothing it stored (no duplicates).
func TestFollowerResumes(t *testing.T) {
	up := servertest.Start(t, server.Config{}, nil)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	appendUp(t, up, 1, 50)
	reg := prometheus.NewRegistry()
	m := feed.NewMetrics(reg)
	f, stop := l.run(t, up.Base+"/v1/streams/devices", m, nil, nil)
	waitCheckpoint(t, f, 50)
	appendUp(t, up, 51, 5) // followed live
	waitCheckpoint(t, f, 55)
	testenv.Eventually(t, 5*time.Second, "lag 0", func() bool {
		return m.Lag("mirror") == 0 && f.Lag() == 0
	})
	stop()
	appendUp(t, up, 56, 10)
	if cp, err := l.cps.Load(context.Background(), "mirror"); err != nil || cp != 55 {
		t.Fatalf("the stored checkpoint is %d (%v), want 55", cp, err)
	}
	f2, _ := l.run(t, up.Base+"/v1/streams/devices/events", m, nil, nil) // the events URL works too
	waitCheckpoint(t, f2, 65)
	wantMirror(t, up, l)
	if dups := m.Events("mirror", "duplicate"); dups != 0 {
		t.Errorf("%v duplicates: the second follower read what the first stored", dups)
	}
	if stored := m.Events("mirror", "stored"); stored != 65 {
		t.Errorf("%v stored, want 65", stored)
	}
}

// flakyFeed serves upstream's feed through failures: a 500, a 401, then
// a connection cut after cut lines, then the whole feed.
func flakyFeed(t *testing.T, upstream string, cut int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			http.Error(w, `{"error":{"code":"unavailable"}}`, http.StatusInternalServerError)
			return
		case 2:
			http.Error(w, `{"error":{"code":"unauthorized"}}`, http.StatusUnauthorized)
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), "GET", upstream+"?"+r.URL.RawQuery, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", feed.ContentType)
		w.WriteHeader(resp.StatusCode)
		lines, buf := 0, make([]byte, 1)
		for { // byte by byte: the cut falls inside a batch
			if _, err := resp.Body.Read(buf); err != nil {
				return
			}
			w.Write(buf)
			if buf[0] == '\n' {
				w.(http.Flusher).Flush()
				if lines++; n.Load() == 3 && lines == cut {
					w.Write([]byte(`{"offset":`)) // and half a line
					return
				}
			}
		}
	}))
	t.Cleanup(ts.Close)
	return ts, &n
}

// TestFollowerReconnects: a 500, a 401 and a connection cut mid-line are
// counted by reason and followed by reconnections (with backoff) from
// the checkpoint; every event is stored once.
func TestFollowerReconnects(t *testing.T) {
	up := servertest.Start(t, server.Config{}, nil)
	appendUp(t, up, 1, 40)
	proxy, requests := flakyFeed(t, up.Base+"/v1/streams/devices/events", 17)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	m := feed.NewMetrics(nil)
	f, _ := l.run(t, proxy.URL+"/v1/streams/devices", m, nil, nil)
	waitCheckpoint(t, f, 40)
	wantMirror(t, up, l)
	for _, reason := range []string{"status", "read"} {
		if n := m.Errors("mirror", reason); n < 1 {
			t.Errorf("errors{reason=%s} = %v, want ≥ 1", reason, n)
		}
	}
	if n := m.Errors("mirror", "status"); n != 2 {
		t.Errorf("errors{reason=status} = %v, want 2 (the 500 and the 401)", n)
	}
	if r := requests.Load(); r != 4 {
		t.Errorf("%d requests, want 4", r)
	}
	if dups := m.Events("mirror", "duplicate"); dups != 0 {
		t.Errorf("%v duplicates after a cut: the follower asked again for what it stored", dups)
	}
}

// flakyCheckpoints fails its second Save.
type flakyCheckpoints struct {
	feed.Checkpoints
	saves atomic.Int32
}

func (c *flakyCheckpoints) Save(ctx context.Context, name string, offset int64) error {
	if c.saves.Add(1) == 2 {
		return errors.New("disk full")
	}
	return c.Checkpoints.Save(ctx, name, offset)
}

// TestFollowerRereadsSafely: when a checkpoint is not saved after its
// events were appended, the follower reads them again, and the stream
// stores them as duplicates: every event once.
func TestFollowerRereadsSafely(t *testing.T) {
	up := servertest.Start(t, server.Config{}, nil)
	appendUp(t, up, 1, 30)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	m := feed.NewMetrics(nil)
	f, _ := l.run(t, up.Base+"/v1/streams/devices", m, &flakyCheckpoints{Checkpoints: l.cps}, func(c *feed.Config) { c.BatchSize = 5 })
	waitCheckpoint(t, f, 30)
	wantMirror(t, up, l)
	if n := m.Errors("mirror", "checkpoint"); n != 1 {
		t.Errorf("errors{reason=checkpoint} = %v, want 1", n)
	}
	if dups := m.Events("mirror", "duplicate"); dups < 1 {
		t.Errorf("no duplicate: the events whose checkpoint failed were not read again")
	}
	if stored := m.Events("mirror", "stored"); stored != 30 {
		t.Errorf("%v stored, want 30", stored)
	}
}

// TestFollowerIdle: a feed that sends nothing, not even heartbeats, is
// left after IdleTimeout and asked again.
func TestFollowerIdle(t *testing.T) {
	var requests atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", feed.ContentType)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	m := feed.NewMetrics(nil)
	l.run(t, ts.URL+"/v1/streams/devices", m, nil, func(c *feed.Config) { c.IdleTimeout = 100 * time.Millisecond })
	testenv.Eventually(t, 10*time.Second, "two idle reconnections", func() bool {
		return m.Errors("mirror", "idle") >= 2 && requests.Load() >= 3
	})
}

// TestFollowerConfig: New names what is missing or wrong.
func TestFollowerConfig(t *testing.T) {
	l := &local{}
	for _, c := range []feed.Config{
		{},
		{URL: "ftp://x/v1/streams/a", Stream: "s", Writer: l.b, Checkpoints: l.cps},
		{URL: "http:///v1/streams/a", Stream: "s", Writer: l.b, Checkpoints: l.cps},
		{URL: "http://x/v1/streams/a", Writer: l.b, Checkpoints: l.cps},
		{URL: "http://x/v1/streams/a", Stream: "s"},
	} {
		if _, err := feed.New(c); err == nil {
			t.Errorf("New(%+v) took it", c)
		}
	}
}

// TestFollowerTokenFromEnvironment: a token "env:NAME" is read at each
// connection; while NAME is unset every attempt fails, counted under
// reason token, and the follower catches up once it is set.
func TestFollowerTokenFromEnvironment(t *testing.T) {
	up := servertest.Start(t, server.Config{APIToken: "s3cret"}, nil)
	appendUp(t, up, 1, 20)
	const name = "POSTBOX_FEED_TEST_TOKEN"
	t.Setenv(name, "")
	os.Unsetenv(name)
	l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
	m := feed.NewMetrics(nil)
	f, _ := l.run(t, up.Base+"/v1/streams/devices", m, nil, func(c *feed.Config) { c.Token = "env:" + name })
	testenv.Eventually(t, 10*time.Second, "failures counted under reason token", func() bool {
		return m.Errors("mirror", "token") >= 2
	})
	if n := m.Errors("mirror", "status"); n != 0 {
		t.Fatalf("%v requests sent without the token (errors{reason=status})", n)
	}
	os.Setenv(name, "s3cret")
	waitCheckpoint(t, f, 20)
	wantMirror(t, up, l)
}
