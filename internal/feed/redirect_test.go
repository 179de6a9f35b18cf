package feed_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestFollowerRedirects: a feed that answers 302 to another loopback port
// (another origin) never sends the token there, nor any request; the
// connection fails (reason connect) and is tried again. A redirect to
// the same origin is followed with the token, unless redirects is
// "none".
func TestFollowerRedirects(t *testing.T) {
	up := servertest.Start(t, server.Config{APIToken: "s3cret"}, nil)
	appendUp(t, up, 1, 5)
	var elsewhere atomic.Int64
	var leaked atomic.Value
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		leaked.Store(r.Header.Get("Authorization"))
		http.Error(w, "no", http.StatusNotFound)
	}))
	t.Cleanup(other.Close)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away/v1/streams/devices/events":
			http.Redirect(w, r, other.URL+"/v1/streams/devices/events?"+r.URL.RawQuery, http.StatusFound)
		case "/here/v1/streams/devices/events":
			http.Redirect(w, r, "/up/v1/streams/devices/events?"+r.URL.RawQuery, http.StatusTemporaryRedirect)
		case "/up/v1/streams/devices/events": // proxied to the upstream postbox
			req, _ := http.NewRequestWithContext(r.Context(), "GET", up.Base+"/v1/streams/devices/events?"+r.URL.RawQuery, nil)
			req.Header = r.Header.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			w.Header().Set("Content-Type", feed.ContentType)
			w.WriteHeader(resp.StatusCode)
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				w.Write(buf[:n])
				w.(http.Flusher).Flush()
				if err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(front.Close)
	token := func(c *feed.Config) { c.Token = "s3cret" }

	t.Run("another origin", func(t *testing.T) {
		l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
		m := feed.NewMetrics(nil)
		l.run(t, front.URL+"/away/v1/streams/devices", m, nil, token)
		testenv.Eventually(t, 10*time.Second, "three failed connections", func() bool {
			return m.Errors("mirror", "connect")+m.Errors("mirror", "status") >= 3
		})
		if n := elsewhere.Load(); n != 0 {
			t.Fatalf("the other origin received %d requests (Authorization %v)", n, leaked.Load())
		}
		if n := m.Errors("mirror", "connect"); n < 3 {
			t.Errorf("errors{reason=connect} = %v, want the refused redirects", n)
		}
	})
	t.Run("same origin", func(t *testing.T) {
		l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
		f, _ := l.run(t, front.URL+"/here/v1/streams/devices", feed.NewMetrics(nil), nil, token)
		waitCheckpoint(t, f, 5)
		wantMirror(t, up, l)
	})
	t.Run("same origin, redirects none", func(t *testing.T) {
		l := openLocal(t, filepath.Join(t.TempDir(), "mirror.db"))
		m := feed.NewMetrics(nil)
		f, _ := l.run(t, front.URL+"/here/v1/streams/devices", m, nil, func(c *feed.Config) { token(c); c.Redirects = "none" })
		testenv.Eventually(t, 10*time.Second, "two failed connections", func() bool { return m.Errors("mirror", "connect") >= 2 })
		if f.Checkpoint() != 0 {
			t.Fatalf("followed a redirect with redirects none: checkpoint %d", f.Checkpoint())
		}
	})
	if err := (feed.Settings{URL: "http://x/v1/streams/a", Redirects: "all"}).Validate(); err == nil {
		t.Error(`redirects "all" validated`)
	}
}
