package main_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/powercut"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// TestPowerCut runs a server and two agents on a filesystem that loses
// what was not synced, and pulls the plug on all three at once at random
// moments while programs feed the agents events: every process is killed
// with SIGKILL and every file turned back to what its last sync made
// durable (in half the cuts, plus a random selection of the writes made
// since). Webhooks are posted to the server meanwhile. After each cut the
// three start again on what is left. At the end every event an agent
// accepted is stored exactly once, every webhook answered 202 or 200
// answers 200 when sent again, every outbox is empty, and every database
// passes SQLite's integrity check.
func TestPowerCut(t *testing.T) {
	if testing.Short() {
		t.Skip("power-cut test runs the real binary")
	}
	pc := powercut.Mount(t)
	addr := freePort(t)
	srv := start(t, "serve", "--addr", addr, "--db", filepath.Join(pc.Dir(), "postbox.db"), "--log-level", "warn")
	waitHTTP(t, "http://"+addr+"/ready", srv)
	agents, producers := startAgents(t, pc.Dir(), "ws://"+addr, 2)

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, pr := range producers {
		wg.Go(func() { pr.run(ctx) })
	}
	wp := &webhookPoster{base: "http://" + addr}
	wg.Go(func() { wp.run(ctx) })
	lost := 0
	for i := range 4 {
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond) // a random moment
		srv.kill()
		for _, a := range agents {
			a.kill()
		}
		n, err := pc.Cut(i%2 == 1)
		if err != nil {
			t.Fatal(err)
		}
		lost += n
		srv.restart()
		for _, a := range agents {
			a.restart()
		}
		waitHTTP(t, "http://"+addr+"/ready", srv)
		for url, a := range agents {
			waitHTTP(t, url+"/health", a)
		}
	}
	time.Sleep(300 * time.Millisecond) // let events flow after the last cut
	stop()
	wg.Wait()
	drained(t, agents)
	webhooks := wp.check(t)
	srv.kill()
	for _, a := range agents {
		a.kill()
	}
	t.Logf("4 power cuts lost %d writes and truncations not yet synced; %d webhooks accepted, each stored once", lost, webhooks)
	if lost == 0 {
		t.Fatal("no cut lost a write: the test proved nothing")
	}
	checkStored(t, filepath.Join(pc.Disk(), "postbox.db"), producers)
	dbs, _ := filepath.Glob(filepath.Join(pc.Disk(), "*.db"))
	for _, path := range dbs {
		db, err := sqlitedb.Open(path, sqlitedb.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		var ok string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
			t.Errorf("%s: integrity check: %q, %v", filepath.Base(path), ok, err)
		}
		db.Close()
	}
}
