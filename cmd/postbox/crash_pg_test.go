package main_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streampg"
)

// TestCrashServerPostgresStreams kills postbox serve --streams postgres://
// with SIGKILL at random moments while agents stream events, restarts it,
// and counts every event: each accepted one is in the PostgreSQL stream
// exactly once at dense offsets, every outbox is drained, and a
// subscription created afterwards from the earliest event gets each once.
func TestCrashServerPostgresStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	dsn := testenv.URL(t, testenv.Postgres)
	schema := fmt.Sprintf("crash_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	t.Cleanup(func() { testenv.DropSchema(t, dsn, schema) })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("schema", schema)
	u.RawQuery = q.Encode()
	crashRunOn(t, 3, []string{"--streams", u.String()}, nil,
		func(srv *proc, srvURL string, _ map[string]*proc) {
			srv.kill()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		auditFromEarliest(t, streampg.BackendName),
		func(t *testing.T, dbPath string, producers []*producer) {
			checkAudited(t, dbPath, producers)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, err := streampg.Open(ctx, streampg.Config{URL: dsn, Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			checkStreamAudited(t, b, dbPath)
		})
}
