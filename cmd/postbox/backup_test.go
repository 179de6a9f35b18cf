package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// backupSummary is what postbox backup and restore --json print.
type backupSummary struct {
	Kind    string
	Bytes   int64
	Schema  map[string]int
	Streams []struct {
		Stream     string
		Events     int64
		LastOffset int64 `json:"last_offset"`
	}
	Subscriptions []struct {
		Subscription string
		NextOffset   int64 `json:"next_offset"`
	}
}

func runJSON(t *testing.T, args ...string) backupSummary {
	t.Helper()
	cmd := exec.Command(binary, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("postbox %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	var s backupSummary
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("postbox %s printed %q: %v", strings.Join(args, " "), out, err)
	}
	return s
}

// TestBackupUnderLoad takes backups of serve's database, with postbox
// backup --db and through the API, while agents send events and webhooks
// are posted, restores one into a fresh file and starts a server on it:
// every event and webhook acknowledged before the backup began is there
// exactly once, the file is intact, and the subscriptions go on from the
// offsets they had.
func TestBackupUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	dir := t.TempDir()
	addr := freePort(t)
	base := "http://" + addr
	dbPath := filepath.Join(dir, "postbox.db")
	srv := start(t, "serve", "--addr", addr, "--db", dbPath, "--log-level", "warn")
	waitHTTP(t, base+"/ready", srv)
	if out, code := run(t, "subscriptions", "create", "audit", "--source", "devices", "--server", base); code != 0 {
		t.Fatalf("subscriptions create: %s", out)
	}
	agents, producers := startAgents(t, dir, "ws://"+addr, 2)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, pr := range producers {
		wg.Go(func() { pr.run(ctx) })
	}
	wp := &webhookPoster{base: base}
	wg.Go(func() { wp.run(ctx) })

	// Wait until events and webhooks were acknowledged, then note them.
	deadline := time.Now().Add(20 * time.Second)
	var ackedEvents []string
	var ackedHooks []int
	for {
		ackedEvents = ackedEvents[:0]
		for _, pr := range producers {
			pr.mu.Lock()
			ackedEvents = append(ackedEvents, pr.accepted...)
			pr.mu.Unlock()
		}
		wp.mu.Lock()
		ackedHooks = ackedHooks[:0]
		for n := range wp.acked {
			ackedHooks = append(ackedHooks, n)
		}
		wp.mu.Unlock()
		if len(ackedEvents) >= 200 && len(ackedHooks) >= 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d events and %d webhooks acknowledged in 20s", len(ackedEvents), len(ackedHooks))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// An agent acknowledges an event when its outbox holds it; the server
	// has it once the outbox drained past it. Wait for that, traffic
	// going on.
	for url, a := range agents {
		for {
			c, err := agentCounts(url)
			if err == nil && c.Pending < 40 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %s does not keep up (%+v, %v): %s", url, c, err, a.log)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	stored := storedIDs(t, dbPath) // acknowledged by the server before the backups began
	local := filepath.Join(dir, "backups", "local.db")
	remote := filepath.Join(dir, "backups", "remote.db")
	sumLocal := runJSON(t, "backup", "--db", dbPath, "--to", local, "--json")
	sumRemote := runJSON(t, "backup", "--server", base, "--to", remote, "--json")
	// An agent's outbox, the agent sending.
	if sum := runJSON(t, "backup", "--db", filepath.Join(dir, "pi-0.db"), "--to", filepath.Join(dir, "backups", "pi-0.db"), "--json"); !strings.HasPrefix(sum.Kind, "outbox") || sum.Schema["outbox"] == 0 {
		t.Fatalf("backup of an agent's outbox: %+v, want kind outbox with its schema version", sum)
	}
	stop()
	wg.Wait()
	srv.kill()
	for _, sum := range []backupSummary{sumLocal, sumRemote} {
		if sum.Kind != "serve database" || sum.Schema["streams"] == 0 || sum.Schema["delivery"] == 0 {
			t.Fatalf("backup summary %+v: want a serve database with its schema versions", sum)
		}
	}

	restored := filepath.Join(dir, "restored", "postbox.db")
	sum := runJSON(t, "restore", "--from", local, "--db", restored, "--json")
	for _, path := range []string{restored, remote} {
		db, err := sqlitedb.OpenReadOnly(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := sqlitedb.IntegrityCheck(context.Background(), db); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		got := map[string]int{}
		rows, err := db.Query(`SELECT stream_id || '/' || source_native_id FROM stream_events`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			rows.Scan(&id)
			got[id]++
		}
		rows.Close()
		db.Close()
		for id := range stored {
			if got[id] != 1 {
				t.Errorf("%s: %s stored before the backup, found %d times in it", path, id, got[id])
			}
		}
		for _, id := range ackedEvents {
			if n := got["devices/"+id]; n > 1 {
				t.Errorf("%s: %s found %d times", path, id, n)
			}
		}
		for _, n := range ackedHooks {
			if k := got[fmt.Sprintf("webhooks/wh-%d", n)]; k != 1 {
				t.Errorf("%s: webhook %d acknowledged before the backup, found %d times in it", path, n, k)
			}
		}
	}
	t.Logf("%d events and %d webhooks acknowledged before the backup, %d stored then; all in it once", len(ackedEvents), len(ackedHooks), len(stored))

	// A server on the restored file starts with the subscriptions where
	// they were, and consumes on from there.
	addr2 := freePort(t)
	srv2 := start(t, "serve", "--addr", addr2, "--db", restored, "--log-level", "warn")
	waitHTTP(t, "http://"+addr2+"/ready", srv2)
	next := map[string]int64{}
	for _, s := range sum.Subscriptions {
		next[s.Subscription] = s.NextOffset
	}
	if next["audit"] == 0 {
		t.Fatalf("restore summary has no subscription audit: %+v", sum)
	}
	deadline = time.Now().Add(20 * time.Second)
	for !caughtUp("http://" + addr2) {
		if time.Now().After(deadline) {
			t.Fatalf("the restored server's subscriptions did not catch up; its log:\n%s", srv2.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var consumers struct {
		Consumers []struct {
			Subscription  string
			NextOffset    int64 `json:"next_offset"`
			HighWatermark int64 `json:"high_watermark"`
		}
	}
	getJSON(t, "http://"+addr2+"/v1/consumers", &consumers)
	for _, c := range consumers.Consumers {
		if c.NextOffset < next[c.Subscription] {
			t.Errorf("subscription %s: next offset %d after the restore, %d in the backup", c.Subscription, c.NextOffset, next[c.Subscription])
		}
	}
	srv2.kill()
	// Every event of the devices stream has one item in audit's inbox.
	db, err := sqlitedb.OpenReadOnly(restored)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var events, items, dupItems int
	db.QueryRow(`SELECT count(*) FROM stream_events WHERE stream_id = 'devices'`).Scan(&events)
	db.QueryRow(`SELECT count(*), count(*) - count(DISTINCT "offset") FROM inbox_items WHERE subscription_id = 'audit'`).Scan(&items, &dupItems)
	if events == 0 || items != events || dupItems != 0 {
		t.Fatalf("restored server: %d device events, %d items of audit (%d duplicates), want one item per event", events, items, dupItems)
	}
}

// storedIDs returns stream/source_native_id of every event in serve's
// database at path.
func storedIDs(t *testing.T, path string) map[string]bool {
	t.Helper()
	db, err := sqlitedb.Open(path, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ids := map[string]bool{}
	rows, err := db.Query(`SELECT stream_id || '/' || source_native_id FROM stream_events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids[id] = true
	}
	return ids
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// bigDB writes a postbox outbox file of about mb MiB at path.
func bigDB(t *testing.T, path string, mb int) int {
	t.Helper()
	db, err := sqlitedb.Open(path, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows := mb * 256 // 4 KiB each
	for _, q := range []string{
		`CREATE TABLE schema_migrations (component TEXT PRIMARY KEY, version INTEGER NOT NULL)`,
		`INSERT INTO schema_migrations VALUES ('outbox', 1)`,
		`CREATE TABLE outbox (seq INTEGER PRIMARY KEY, state TEXT NOT NULL, payload BLOB)`,
		fmt.Sprintf(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d)
			INSERT INTO outbox (state, payload) SELECT 'pending', randomblob(4000) FROM n`, rows),
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return rows
}

// TestBackupKilledLeavesNoFile kills postbox backup with SIGKILL while
// it copies: there is never a file at the backup's name that is not the
// complete backup, and the next backup removes the partial one.
func TestBackupKilledLeavesNoFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "outbox.db")
	rows := bigDB(t, src, 48)
	to := filepath.Join(dir, "backups", "outbox.db")
	os.MkdirAll(filepath.Dir(to), 0o755)
	midCopy := 0
	for try := range 5 {
		os.Remove(to)
		cmd := exec.Command(binary, "backup", "--db", src, "--to", to)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		// Kill it once its partial file is there, at once on the first
		// try, later after a random while.
		delay := time.Duration(try*rand.IntN(60)) * time.Millisecond
	wait:
		for {
			select {
			case <-exited:
				break wait
			default:
			}
			if partials(t, to) > 0 {
				time.Sleep(delay)
				cmd.Process.Signal(syscall.SIGKILL)
				<-exited
				break
			}
			time.Sleep(time.Millisecond)
		}
		if _, err := os.Stat(to); err == nil {
			checkBackup(t, to, rows) // it completed before the kill: it must be whole
		} else if partials(t, to) > 0 {
			midCopy++ // killed mid-copy: its partial file is there, no file at its name
		}
	}
	if midCopy == 0 {
		t.Fatal("no kill landed while the backup copied: the test proved nothing")
	}
	if out, code := run(t, "backup", "--db", src, "--to", to); code != 0 {
		t.Fatalf("backup after the kills: %s", out)
	}
	checkBackup(t, to, rows)
	if n := partials(t, to); n != 0 {
		t.Fatalf("%d partial files left after a complete backup", n)
	}
	t.Logf("%d of 5 kills landed mid-copy", midCopy)
}

// partials counts the partial files of backups to name.
func partials(t *testing.T, name string) int {
	m, err := filepath.Glob(name + ".*" + sqlitedb.PartialSuffix)
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// checkBackup fails unless the backup at path is intact and holds rows
// rows of outbox.
func checkBackup(t *testing.T, path string, rows int) {
	t.Helper()
	db, err := sqlitedb.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlitedb.IntegrityCheck(context.Background(), db); err != nil {
		t.Fatalf("backup %s: %v", path, err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != rows {
		t.Fatalf("backup %s: %d rows (%v), want %d", path, n, err, rows)
	}
}

// TestRestoreRefuses: postbox restore exits non-zero, naming why, and
// leaves the target as it was, when the database is in use, exists
// (without --force), or the backup is damaged or not a database.
func TestRestoreRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	bigDB(t, good, 1)
	damaged := filepath.Join(dir, "damaged.db")
	data, _ := os.ReadFile(good)
	for i := 4 * 4096; i+8 < len(data); i += 4096 { // the header of every page after the first four
		copy(data[i:i+8], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	}
	os.WriteFile(damaged, data, 0o644)
	truncated := filepath.Join(dir, "truncated.db")
	os.WriteFile(truncated, data[:len(data)/2], 0o644)
	garbage := filepath.Join(dir, "garbage.db")
	os.WriteFile(garbage, []byte(strings.Repeat("not a database\n", 500)), 0o644)

	existing := filepath.Join(dir, "existing.db")
	bigDB(t, existing, 1)
	inUse := filepath.Join(dir, "inuse", "postbox.db")
	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", inUse, "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)

	for _, tc := range []struct {
		name, from, to string
		force          bool
		want           []string
	}{
		{"in use", good, inUse, true, []string{"in use", "pid", "stop the process"}},
		{"exists", good, existing, false, []string{"exists", "--force"}},
		{"damaged", damaged, filepath.Join(dir, "new1.db"), false, []string{damaged, "integrity check failed"}},
		{"truncated", truncated, filepath.Join(dir, "new2.db"), false, []string{"--from " + truncated}},
		{"not a database", garbage, filepath.Join(dir, "new3.db"), false, []string{"not a database"}},
		{"no such backup", filepath.Join(dir, "none.db"), filepath.Join(dir, "new4.db"), false, []string{"no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(tc.to)
			beforeFile, _ := os.Stat(tc.to)
			args := []string{"restore", "--from", tc.from, "--db", tc.to}
			if tc.force {
				args = append(args, "--force")
			}
			out, code := run(t, args...)
			if code == 0 {
				t.Fatalf("restore succeeded: %s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("restore said %q, want it to name %q", out, w)
				}
			}
			afterFile, _ := os.Stat(tc.to)
			switch after, _ := os.ReadFile(tc.to); {
			case beforeFile == nil && afterFile != nil:
				t.Errorf("the refused restore wrote %s", tc.to)
			case beforeFile != nil && (afterFile == nil || !os.SameFile(beforeFile, afterFile)):
				t.Errorf("the refused restore replaced %s", tc.to)
			case tc.to != inUse && string(after) != string(before): // serve writes its own
				t.Errorf("the refused restore changed %s", tc.to)
			}
		})
	}
	if out, code := run(t, "restore", "--from", good, "--db", existing, "--force"); code != 0 {
		t.Fatalf("restore --force over a database not in use: %s", out)
	}
}

// TestBackupAPI: GET /v1/backup needs the API token like every operator
// route, and answers a whole, intact database file.
func TestBackupAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the real binary")
	}
	dir := t.TempDir()
	addr := freePort(t)
	base := "http://" + addr
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(dir, "postbox.db"), "--api-token", "s3cret", "--log-level", "warn")
	waitHTTP(t, base+"/ready", srv)

	resp, err := http.Get(base + "/v1/backup")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/backup without the token: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", base+"/v1/backup", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(body)) || !strings.HasPrefix(string(body), "SQLite format 3\x00") {
		t.Fatalf("GET /v1/backup with the token: %d, Content-Length %d, %d bytes starting %.16q", resp.StatusCode, resp.ContentLength, len(body), body)
	}
	// The handler removes its snapshot once the answer is written: a
	// moment after the client read the last byte.
	var leftovers []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		leftovers, _ = filepath.Glob(filepath.Join(dir, ".*"+sqlitedb.PartialSuffix))
		if len(leftovers) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(leftovers) > 0 {
		t.Fatalf("the server left its snapshot files: %v", leftovers)
	}

	to := filepath.Join(dir, "backup.db")
	out, code := run(t, "backup", "--server", base, "--to", to)
	if code == 0 || !strings.Contains(out, "token") {
		t.Fatalf("backup --server without --token: exit %d, %s; want a refusal naming the token", code, out)
	}
	if _, err := os.Stat(to); err == nil {
		t.Fatal("a refused backup left a file at --to")
	}
	cmd := exec.Command(binary, "backup", "--server", base, "--to", to)
	cmd.Env = append(os.Environ(), "POSTBOX_API_TOKEN=s3cret")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("backup --server with POSTBOX_API_TOKEN: %v\n%s", err, out)
	}
	db, err := sqlitedb.OpenReadOnly(to)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlitedb.IntegrityCheck(context.Background(), db); err != nil {
		t.Fatal(err)
	}
}

// TestBackupRefuses: postbox backup exits non-zero, naming why, and
// writes nothing, for a file that is not postbox's or not there, and
// for flags that do not say what to back up or where.
func TestBackupRefuses(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "app.db")
	db, err := sqlitedb.Open(foreign, sqlitedb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	to := filepath.Join(dir, "backup.db")
	for _, tc := range []struct {
		name string
		args []string
		want string
		code int
	}{
		{"not postbox's", []string{"--db", foreign, "--to", to}, "not a postbox database", 1},
		{"no such file", []string{"--db", filepath.Join(dir, "none.db"), "--to", to}, "no such file", 1},
		{"no --to", []string{"--db", foreign}, "--to FILE is required", 2},
		{"nothing to back up", []string{"--to", to}, "give --db FILE", 2},
		{"both", []string{"--db", foreign, "--server", "http://127.0.0.1:9", "--to", to}, "not both", 2},
		{"onto itself", []string{"--db", foreign, "--to", foreign}, "the database itself", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := run(t, append([]string{"backup"}, tc.args...)...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("backup %v: exit %d, %q; want exit %d naming %q", tc.args, code, out, tc.code, tc.want)
			}
			if _, err := os.Stat(to); err == nil {
				t.Fatal("a refused backup wrote its file")
			}
		})
	}
}
