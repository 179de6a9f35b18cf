package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/feed"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// mirror is a second server (in-process) with a feed follower of the
// first's devices stream appending to its own devices stream through its
// writer.
type mirror struct {
	t        *testing.T
	dbPath   string
	srv      *servertest.Server
	follower *feed.Follower
	stop     context.CancelFunc
	done     chan error
}

func startMirror(t *testing.T, dbPath, feedURL string) *mirror {
	m := &mirror{t: t, dbPath: dbPath}
	m.start(feedURL)
	t.Cleanup(m.halt)
	return m
}

func (m *mirror) start(feedURL string) {
	m.t.Helper()
	m.srv = servertest.Start(m.t, server.Config{DBPath: m.dbPath}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cps, err := feed.NewStoreCheckpoints(ctx, m.srv.Store())
	if err != nil {
		m.t.Fatal(err)
	}
	f, err := feed.New(feed.Config{URL: feedURL, Stream: server.DeviceSource, Name: "mirror",
		Writer: m.srv.Srv.Writer(), Checkpoints: cps, MinBackoff: 20 * time.Millisecond, MaxBackoff: 300 * time.Millisecond,
		IdleTimeout: 5 * time.Second})
	if err != nil {
		m.t.Fatal(err)
	}
	m.follower, m.stop, m.done = f, cancel, make(chan error, 1)
	go func() { m.done <- f.Run(ctx) }()
}

// halt stops the follower, then the server.
func (m *mirror) halt() {
	if m.stop == nil {
		return
	}
	m.stop()
	select {
	case err := <-m.done:
		if err != nil {
			m.t.Errorf("follower Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		m.t.Errorf("follower Run did not return 10s after its context ended")
	}
	m.stop = nil
	m.srv.Stop()
}

// TestFeedCrash: a second server follows the first's devices feed while
// agents send to the first, which is killed with SIGKILL and restarted
// five times; the second is restarted once. At the end the second holds
// every event of the first's devices stream exactly once, with the same
// identity, type, metadata and payload bytes.
func TestFeedCrash(t *testing.T) {
	dir := t.TempDir()
	var m *mirror
	crashes := 0
	crashRunOn(t, 3, nil,
		func(srvURL string) {
			m = startMirror(t, filepath.Join(dir, "mirror.db"), srvURL+"/v1/streams/devices")
		},
		func(srv *proc, srvURL string, _ map[string]*proc) {
			crashes++
			srv.kill()
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // down for a random while
			if crashes == 3 {
				// The mirror too, while the first is down.
				m.halt()
				m.start(srvURL + "/v1/streams/devices")
			}
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		func(srvURL, _ string) {
			last := lastOffset(t, srvURL)
			deadline := time.Now().Add(60 * time.Second)
			for m.follower.Checkpoint() < last {
				if time.Now().After(deadline) {
					t.Fatalf("the mirror's checkpoint is %d, the first's devices stream ends at %d", m.follower.Checkpoint(), last)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("the mirror caught up at offset %d", last)
			m.halt()
		},
		func(t *testing.T, dbPath string, producers []*producer) {
			checkStored(t, dbPath, producers)
			first, second := deviceEvents(t, dbPath), deviceEvents(t, m.dbPath)
			for id, n := range second {
				if n.count != 1 {
					t.Errorf("the mirror holds %v %d times", id, n.count)
				}
				if _, ok := first[id]; !ok {
					t.Errorf("the mirror holds %v, which the first does not", id)
				}
			}
			for id, e := range first {
				if got, ok := second[id]; !ok {
					t.Errorf("the mirror lacks %v", id)
				} else if got.row != e.row {
					t.Errorf("%v: the mirror holds %+v, the first %+v", id, got.row, e.row)
				}
			}
			t.Logf("the first's devices stream holds %d events, the mirror's %d", len(first), len(second))
		})
}

type identity struct{ nativeID, variant string }

type storedRow struct {
	typ, metadata, payload string
	sequence               *int64
}

type storedCount struct {
	row   storedRow
	count int
}

// deviceEvents reads a SQLite file's devices stream by identity.
func deviceEvents(t *testing.T, dbPath string) map[identity]storedCount {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT source_native_id, event_variant, event_type, metadata_json, raw_payload_json, source_sequence
		FROM stream_events WHERE stream_id = 'devices'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[identity]storedCount{}
	for rows.Next() {
		var id identity
		var r storedRow
		if err := rows.Scan(&id.nativeID, &id.variant, &r.typ, &r.metadata, &r.payload, &r.sequence); err != nil {
			t.Fatal(err)
		}
		c := out[id]
		c.row, c.count = r, c.count+1
		out[id] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// lastOffset returns the last offset of the devices stream at srvURL.
func lastOffset(t *testing.T, srvURL string) int64 {
	t.Helper()
	resp, err := http.Get(srvURL + "/v1/streams/devices")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		LastOffset int64 `json:"last_offset"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatal(fmt.Errorf("GET /v1/streams/devices: %d %v", resp.StatusCode, err))
	}
	return s.LastOffset
}
