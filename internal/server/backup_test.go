package server_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/delivery/deliverypg"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
	"github.com/postbox-events/postbox/stream/streampg"
)

// TestBackupRoute: GET /v1/backup answers an intact copy of a SQLite
// store to a caller with the token, 401 without it, and 501 naming
// PostgreSQL's tools on a PostgreSQL store.
func TestBackupRoute(t *testing.T) {
	ts := start(t, server.Config{APIToken: "s3cret"}, nil)
	anon, err := client.NewAPI(ts.Base, client.APIOptions{HTTPClient: ts.HTTP})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Backup(testCtx(t, 10*time.Second), new(discard)); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("GET /v1/backup without the token: %v, want 401", err)
	}
	api, err := client.NewAPI(ts.Base, client.APIOptions{Token: "s3cret", HTTPClient: ts.HTTP})
	if err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	n, err := api.Backup(testCtx(t, 10*time.Second), f)
	f.Close()
	if err != nil || n == 0 {
		t.Fatalf("GET /v1/backup: %d bytes, %v", n, err)
	}
	db, err := sqlitedb.OpenReadOnly(to)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlitedb.IntegrityCheck(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	var streams int
	if err := db.QueryRow(`SELECT count(*) FROM streams`).Scan(&streams); err != nil || streams == 0 {
		t.Fatalf("the backup holds %d streams (%v), want the server's", streams, err)
	}

	t.Run("postgres", func(t *testing.T) {
		u := testenv.PostgresSchema(t)
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		schema := pu.Query().Get("search_path")
		ctx := testCtx(t, 30*time.Second)
		streams, err := streampg.Open(ctx, streampg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		store, err := deliverypg.Open(ctx, deliverypg.Config{URL: u, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		pg := start(t, server.Config{Streams: streams, Store: store}, nil) // the server closes them
		api, err := client.NewAPI(pg.Base, client.APIOptions{HTTPClient: pg.HTTP})
		if err != nil {
			t.Fatal(err)
		}
		_, err = api.Backup(ctx, new(discard))
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusNotImplemented || ae.Code != "not_kept" {
			t.Fatalf("GET /v1/backup on a PostgreSQL store: %v, want 501 not_kept", err)
		}
	})
}

type discard struct{ n int }

func (d *discard) Write(p []byte) (int, error) { d.n += len(p); return len(p), nil }
