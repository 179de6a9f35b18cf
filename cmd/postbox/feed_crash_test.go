package main_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/servertest"
	"github.com/postbox-events/postbox/internal/sqlitedb"
)

// mirror is a second server (in-process) with a source of kind feed,
// mirror, following the first's devices stream into its own stream
// mirror: created through the API once, run by the server's source
// runner from its checkpoint at each start.
type mirror struct {
	t      *testing.T
	dbPath string
	srv    *servertest.Server
}

func startMirror(t *testing.T, dbPath, feedURL string) *mirror {
	m := &mirror{t: t, dbPath: dbPath}
	m.start()
	body, _ := json.Marshal(map[string]any{"name": "mirror", "kind": "feed", "settings": map[string]string{"url": feedURL}})
	resp, err := http.Post(m.srv.Base+"/v1/sources", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create the feed source: %s", resp.Status)
	}
	return m
}

func (m *mirror) start() {
	m.t.Helper()
	m.srv = servertest.Start(m.t, server.Config{DBPath: m.dbPath}, nil)
}

// checkpoint returns the remote offset the mirror's feed source stored
// last (its checkpoint's cursor).
func (m *mirror) checkpoint() int64 {
	resp, err := http.Get(m.srv.Base + "/v1/sources/mirror")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var src struct {
		Checkpoint struct {
			Cursor string `json:"cursor"`
		} `json:"checkpoint"`
	}
	if json.NewDecoder(resp.Body).Decode(&src) != nil {
		return -1
	}
	n, _ := strconv.ParseInt(src.Checkpoint.Cursor, 10, 64)
	return n
}

// halt stops the server, and with it the follower.
func (m *mirror) halt() { m.srv.Stop() }

// TestFeedCrash: a second server follows the first's devices feed (a
// source of kind feed) while
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
				m.start()
			}
			srv.restart()
			waitHTTP(t, srvURL+"/ready", srv)
		},
		func(srvURL, _ string) {
			last := lastOffset(t, srvURL)
			deadline := time.Now().Add(60 * time.Second)
			for m.checkpoint() < last {
				if time.Now().After(deadline) {
					t.Fatalf("the mirror's checkpoint is %d, the first's devices stream ends at %d", m.checkpoint(), last)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("the mirror caught up at offset %d", last)
			m.halt()
		},
		func(t *testing.T, dbPath string, producers []*producer) {
			checkStored(t, dbPath, producers)
			first, second := streamEvents(t, dbPath, "devices"), streamEvents(t, m.dbPath, "mirror")
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

// streamEvents reads a stream of a SQLite file by identity.
func streamEvents(t *testing.T, dbPath, streamID string) map[identity]storedCount {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT source_native_id, event_variant, event_type, metadata_json, raw_payload_json, source_sequence
		FROM stream_events WHERE stream_id = ?`, streamID)
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
