package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/postbox-events/postbox/internal/sqlitedb"
	"github.com/postbox-events/postbox/internal/testenv"
)

// crashAPI is a fake paged API of 10,000 items in 100 pages of 100 by
// ?after=N: page N/100 holds items N+1..N+100 and names the next cursor,
// the last page none. It misbehaves once each: pages 10, 30 and 50 are
// first answered with their own cursor as the next one (the poller asks
// for them again), page 40 with 429 and Retry-After: 1, page 60 with 500.
type crashAPI struct {
	mu     sync.Mutex
	served map[int]int // answers (200) by page
	pages  int         // answers (200) in all
	odd    map[string]bool
}

const (
	crashPages   = 100
	crashPerPage = 100
)

func (a *crashAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	after, err := strconv.Atoi(r.URL.Query().Get("after"))
	if r.URL.Query().Get("after") == "" {
		after, err = 0, nil
	}
	if err != nil || after%crashPerPage != 0 || after >= crashPages*crashPerPage {
		http.Error(w, "bad cursor", http.StatusBadRequest)
		return
	}
	page := after / crashPerPage
	once := func(what string) bool { // true the first time
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.odd[what] {
			return false
		}
		a.odd[what] = true
		return true
	}
	switch {
	case page == 40 && once("429"):
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	case page == 60 && once("500"):
		http.Error(w, "oops", http.StatusInternalServerError)
		return
	}
	time.Sleep(10 * time.Millisecond) // a remote API takes a while: the kills land mid-way
	next := after + crashPerPage
	if (page == 10 || page == 30 || page == 50) && once(fmt.Sprint("again", page)) {
		next = after // served twice
	}
	type item struct {
		ID        string `json:"id"`
		Type      string `json:"type"`
		CreatedAt int64  `json:"created_at"`
		N         int    `json:"n"`
	}
	var out struct {
		Events []item  `json:"events"`
		Next   *string `json:"next_cursor"`
	}
	for i := after + 1; i <= after+crashPerPage; i++ {
		out.Events = append(out.Events, item{ID: fmt.Sprintf("ev-%05d", i), Type: "push", CreatedAt: 1700000000 + int64(i), N: i})
	}
	if next < crashPages*crashPerPage {
		c := strconv.Itoa(next)
		out.Next = &c
	}
	a.mu.Lock()
	a.served[page]++
	a.pages++
	a.mu.Unlock()
	json.NewEncoder(w).Encode(out)
}

func (a *crashAPI) answered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pages
}

// pollState reads a SQLite file's poll source gh: how many times each
// item is stored, and its checkpoint's cursor.
func pollState(t *testing.T, dbPath string) (map[string]int, string) {
	t.Helper()
	db, err := sqlitedb.Open(dbPath, sqlitedb.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT source_native_id, count(*) FROM stream_events WHERE stream_id = 'gh' GROUP BY source_native_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		ids[id] = n
	}
	var cursor string
	db.QueryRow(`SELECT coalesce(next_cursor, '') FROM source_checkpoints WHERE source_id = 'gh'`).Scan(&cursor)
	return ids, cursor
}

// TestPollCrash: serve polls a fake API of 10,000 items over 100 pages
// (some served twice, a 429 with Retry-After, a 500) and is killed with
// SIGKILL twice mid-way and restarted. After each kill the stored
// checkpoint is never ahead of the stored items (they commit in one
// transaction: the items stored are those before the cursor and at most
// the page at it); at the end every item is stored exactly once and the
// checkpoint is at the last page.
func TestPollCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs the real binary")
	}
	api := &crashAPI{served: map[int]int{}, odd: map[string]bool{}}
	ts := httptest.NewServer(api)
	defer ts.Close()
	dir := t.TempDir()
	addr := freePort(t)
	dbPath := filepath.Join(dir, "postbox.db")
	srv := start(t, "serve", "--addr", addr, "--db", dbPath, "--log-level", "warn")
	base := "http://" + addr
	waitHTTP(t, base+"/ready", srv)
	out, errOut, code := runCLI(t, base, "sources", "create", "gh", "--poll", ts.URL+"/events", "--items", "/events", "--id", "/id",
		"--type", "/type", "--time", "/created_at", "--cursor-param", "after", "--next", "/next_cursor", "--interval", "50ms")
	if code != 0 {
		t.Fatalf("sources create: %d %s %s", code, out, errOut)
	}
	for _, at := range []int{25, 70} {
		testenv.Eventually(t, 120*time.Second, fmt.Sprintf("the API to have answered %d pages", at), func() bool { return api.answered() >= at })
		srv.kill()
		ids, cursor := pollState(t, dbPath)
		c, _ := strconv.Atoi(cursor)
		for id, n := range ids {
			var i int
			fmt.Sscanf(id, "ev-%d", &i)
			if n != 1 || i > c+crashPerPage {
				t.Errorf("after the kill at %d pages: %s stored %d times, the checkpoint at %q", at, id, n, cursor)
			}
		}
		for i := 1; i <= c; i++ {
			if ids[fmt.Sprintf("ev-%05d", i)] != 1 {
				t.Fatalf("after the kill at %d pages: the checkpoint is at %q but ev-%05d is not stored", at, cursor, i)
			}
		}
		t.Logf("killed after %d pages: %d items stored, checkpoint %q", api.answered(), len(ids), cursor)
		srv.restart()
		waitHTTP(t, base+"/ready", srv)
	}
	last := strconv.Itoa((crashPages - 1) * crashPerPage)
	testenv.Eventually(t, 120*time.Second, "every item stored and the checkpoint at the last page", func() bool {
		var src struct {
			Checkpoint struct {
				Cursor string `json:"cursor"`
			} `json:"checkpoint"`
		}
		resp, err := http.Get(base + "/v1/sources/gh")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(&src)
		st := streamLast(base, "gh")
		return src.Checkpoint.Cursor == last && st == crashPages*crashPerPage
	})
	srv.kill()
	ids, cursor := pollState(t, dbPath)
	if len(ids) != crashPages*crashPerPage || cursor != last {
		t.Fatalf("%d items stored, checkpoint %q; want %d and %q", len(ids), cursor, crashPages*crashPerPage, last)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s stored %d times", id, n)
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	for p := range crashPages {
		if api.served[p] == 0 {
			t.Errorf("page %d never asked for", p)
		}
	}
	if !api.odd["429"] || !api.odd["500"] || !api.odd["again30"] {
		t.Errorf("the API's misbehaviours did not all happen: %v", api.odd)
	}
	t.Logf("%d answers for %d pages", api.pages, crashPages)
}

// streamLast returns the last offset of a stream at base, -1 on error.
func streamLast(base, stream string) int64 {
	resp, err := http.Get(base + "/v1/streams/" + stream)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var s struct {
		LastOffset int64 `json:"last_offset"`
	}
	if json.NewDecoder(resp.Body).Decode(&s) != nil {
		return -1
	}
	return s.LastOffset
}
