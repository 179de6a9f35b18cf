package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox"
	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// TestLitestream replicates serve's database with Litestream to a file
// replica while devices send events, kills serve with SIGKILL, lets
// Litestream ship what the log holds, kills Litestream with SIGKILL too,
// and restores the replica with litestream restore: every event serve
// ACKed is in the restored database exactly once, and the file passes
// integrity_check. Litestream checkpoints often here (every second, from
// 64 pages), so its checkpoints meet serve's own while events flow.
//
// Run once with each checkpoint mode of serve: auto (postbox checkpoints
// as without Litestream) and litestream (postbox leaves it to Litestream).
func TestLitestream(t *testing.T) {
	if testing.Short() {
		t.Skip("litestream test runs the real binaries")
	}
	litestream, err := exec.LookPath("litestream")
	if err != nil {
		testenv.Skip(t, "litestream is not on PATH; install it with "+
			"go install github.com/benbjohnson/litestream/cmd/litestream@v0.5.18")
	}
	for _, mode := range []string{"auto", "litestream"} {
		t.Run(mode, func(t *testing.T) { litestreamRun(t, litestream, mode) })
	}
}

func litestreamRun(t *testing.T, litestream, mode string) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "postbox.db")
	config := filepath.Join(dir, "litestream.yml")
	yml := fmt.Sprintf(`dbs:
  - path: %s
    monitor-interval: 50ms
    checkpoint-interval: 1s
    min-checkpoint-page-count: 64
    replica:
      type: file
      path: %s
      sync-interval: 100ms
`, dbPath, filepath.Join(dir, "replica"))
	if err := os.WriteFile(config, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}

	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", dbPath, "--log-level", "warn", "--wal-checkpoint", mode)
	waitHTTP(t, "http://"+addr+"/ready", srv)
	ls := &proc{t: t, bin: litestream, args: []string{"replicate", "-config", config}}
	ls.restart()
	t.Cleanup(ls.kill)

	// Devices send batches and keep the ids serve ACKed, until serve is
	// killed under them.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		mu    sync.Mutex
		acked []string
		wg    sync.WaitGroup
	)
	for d := range 4 {
		wg.Go(func() {
			c, err := client.Dial(ctx, "ws://"+addr, client.Options{})
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			for n := 0; ctx.Err() == nil; n++ {
				msgs := make([]client.Message, 50)
				for i := range msgs {
					m, err := client.Encode(postbox.Envelope{
						SchemaVersion: postbox.SchemaVersion,
						EventID:       fmt.Sprintf("evt_ls_%d_%06d_%02d", d, n, i),
						Type:          "litestream.test",
						TS:            time.Now().UTC().Format(time.RFC3339Nano),
						SessionID:     "sess-1",
						DeviceID:      fmt.Sprintf("pi-%d", d),
						Payload:       json.RawMessage(`{"pad":"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz"}`),
					})
					if err != nil {
						t.Error(err)
						return
					}
					msgs[i] = m
				}
				replies, err := c.Send(ctx, msgs)
				if err != nil {
					return // serve was killed
				}
				mu.Lock()
				for _, r := range replies {
					if r.Status == postbox.StatusStored {
						acked = append(acked, r.EventID)
					}
				}
				mu.Unlock()
			}
		})
	}
	// Events flow until enough were ACKed for both programs to have
	// checkpointed a few times.
	testenv.Eventually(t, 60*time.Second, "20,000 events ACKed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 20000
	})
	srv.kill() // the cut-off: what serve ACKed until now must be in the replica
	stop()
	wg.Wait()
	mu.Lock()
	want := append([]string(nil), acked...)
	mu.Unlock()

	// Litestream ships the log serve left within its sync interval; a
	// restore of the replica holds every ACKed event once it has.
	restore := func(out string) error {
		if b, err := exec.Command(litestream, "restore", "-config", config, "-o", out, dbPath).CombinedOutput(); err != nil {
			return fmt.Errorf("litestream restore: %v\n%s", err, b)
		}
		return nil
	}
	count := func(path string) (int, error) {
		db, err := sqlitedb.Open(path, sqlitedb.Options{ReadOnly: true})
		if err != nil {
			return 0, err
		}
		defer db.Close()
		var n int
		err = db.QueryRow(`SELECT count(*) FROM stream_events WHERE stream_id = 'devices'`).Scan(&n)
		return n, err
	}
	var lastErr error
	round := 0
	testenv.Eventually(t, 60*time.Second, "the replica to hold every ACKed event", func() bool {
		round++
		out := filepath.Join(dir, fmt.Sprintf("probe-%d.db", round))
		if lastErr = restore(out); lastErr != nil {
			return false
		}
		n, err := count(out)
		lastErr = err
		return err == nil && n >= len(want)
	})
	ls.kill()

	restored := filepath.Join(dir, "restored.db")
	if err := restore(restored); err != nil {
		t.Fatalf("%v (last probe: %v); litestream's log:\n%s", err, lastErr, ls.log)
	}
	db, err := sqlitedb.Open(restored, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check of the restored database: %q, %v", check, err)
	}
	stored := map[string]int{}
	rows, err := db.Query(`SELECT source_native_id FROM stream_events WHERE stream_id = 'devices'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		stored[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	missing := 0
	for _, id := range want {
		if stored[id] != 1 {
			missing++
			if missing <= 10 {
				t.Errorf("%s: ACKed by serve, %d times in the restored database", id, stored[id])
			}
		}
	}
	for id, n := range stored {
		if n != 1 {
			t.Errorf("%s is %d times in the restored database", id, n)
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d ACKed events are not in the restored database once; litestream's log:\n%s", missing, len(want), ls.log)
	}
	t.Logf("%d events ACKed before the cut-off, %d in the restored database", len(want), len(stored))
}
